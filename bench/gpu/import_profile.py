"""Where a hydrali run's start-up goes in imports: run a command under Python's `-X importtime` and print the import
time of each top-level package it loaded (cumulative, from the interpreter's own record), largest first.

    python3 -m hydrali.bench.gpu.import_profile -- python3 -m hydrali.core experiment=cifar10 epochs=1 ...

The command's own output is kept in --log (stderr holds both its log and Python's import records); the table goes to
stdout. Every import is counted once, where it first happened: a package another one pulled in counts under the
package whose import started it (`lightning 2.1 s` includes what lightning imported that nothing imported before).
Two limits of Python's records: a module loaded by `importlib.import_module` (hydrali's backend, Hydra's `_target_`)
has no record of its own, so what it imports shows at the top level; and every Python process the command starts
inherits the profiling (PYTHONPROFILEIMPORTTIME), its records summed in with the parent's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict

_MARK = "import time:"
_MICROSECONDS = 1e-6
_TOP = 20  # rows of the table


def top_level_imports(stderr_lines: list[str]) -> dict[str, float]:
    """Seconds of cumulative import time per top-level package name, from `-X importtime` records: only records
    at nesting depth 0 (the name has no leading spaces) are summed, so nothing counts twice."""
    seconds: dict[str, float] = defaultdict(float)
    for line in stderr_lines:
        if not line.startswith(_MARK):
            continue
        fields = line[len(_MARK) :].split("|")
        if len(fields) != 3 or not fields[1].strip().isdigit():  # the header line
            continue
        name = fields[2].rstrip("\n")
        if name.startswith("  "):  # one level down or deeper: counted in its top-level import
            continue
        seconds[name.strip().split(".")[0]] += int(fields[1]) * _MICROSECONDS
    return dict(seconds)


def main(argv: list[str] | None = None) -> int:
    """Run the command with PYTHONPROFILEIMPORTTIME=1 and print its imports' seconds by top-level package."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", default="import_profile.log", help="where the command's stderr is kept")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    started = time.perf_counter()
    with open(args.log, "w") as log:
        done = subprocess.run(command, stderr=log, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}, check=False)
    wall = time.perf_counter() - started
    with open(args.log) as log:
        seconds = top_level_imports(log.readlines())
    total = sum(seconds.values())
    print("| package | import s | share of imports |\n| --- | --- | --- |")
    for name, value in sorted(seconds.items(), key=lambda item: -item[1])[:_TOP]:
        print(f"| {name} | {value:.2f} | {value / total:.0%} |")
    summary = f"command's wall {wall:.1f} s, exit {done.returncode}"
    print(f"| (all {len(seconds)} top-level packages) | {total:.2f} | {summary} |")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
