"""Where a hydrali command's own process spends the time around its run: seconds from its start to its first line of
output, to its summary table's last line, and from there to its exit (the interpreter's teardown, which the run's
wall time does not hold), over `--repeats` runs of the same command. From the repository root:

    python -m hydrali.bench.command_timing --repeats 3 -- .venv/bin/hydrali epochs=1 tracking=none

Each repeat runs in a new run dir: pass no hydra.run.dir (one under a temporary folder is added). Prints one line per
repeat and the median of each column."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUMMARY_END = "output dir"  # the summary table's last named row (core/run/summary.py format_table)


def time_command(command: list[str]) -> dict[str, float]:
    """Seconds from the start of `command` to its first output line, to its summary's last row, and from that row to
    its exit; its exit code."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = summary = None
    assert process.stdout is not None
    for line in process.stdout:
        now = time.perf_counter() - started
        first = now if first is None else first
        if line.startswith(SUMMARY_END):
            summary = now
    code = process.wait()
    ended = time.perf_counter() - started
    if summary is None:
        raise SystemExit(f"command_timing: {' '.join(command)} printed no summary (exit {code})")
    return {"first_line_s": first or 0.0, "summary_s": summary, "exit_after_summary_s": ended - summary, "rc": code}


def main() -> None:
    """Time the command after `--` `--repeats` times and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of the command (default 3)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the hydrali command and its overrides")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("pass the command after --")
    rows = []
    with tempfile.TemporaryDirectory(prefix="hydrali_timing_") as scratch:
        for repeat in range(args.repeats):
            rows.append(time_command([*command, f"hydra.run.dir={Path(scratch) / f'run{repeat}'}"]))
            row = rows[-1]
            print(
                f"run {repeat + 1}: first line {row['first_line_s']:.2f} s, summary {row['summary_s']:.2f} s, "
                f"exit {row['exit_after_summary_s']:.2f} s after it (exit code {row['rc']})",
                flush=True,
            )
    medians = {key: statistics.median(row[key] for row in rows) for key in ("first_line_s", "summary_s")}
    exit_median = statistics.median(row["exit_after_summary_s"] for row in rows)
    print(
        f"median of {len(rows)}: first line {medians['first_line_s']:.2f} s, summary {medians['summary_s']:.2f} s, "
        f"exit {exit_median:.2f} s after it"
    )
    sys.exit(max(int(row["rc"]) for row in rows))


if __name__ == "__main__":
    main()
