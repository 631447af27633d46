"""The GPU acceptance check: the same experiment gives the same result on 1 and on 2 GPUs, on both backends.

Each row of acceptance.yaml (beside this file) trains its config on each backend on 1 GPU and on 2 GPUs at the same
global batch, with the row's seeds, as `hydrali` commands run one after the other; the check prints a table (the best
validation metric, training seconds, images/s, per side and backend) and exits 1 when a 2-GPU mean falls below the
1-GPU mean by more than the row's tolerance, a run fails, or a DDP run's log holds torch's AccumulateGrad stream
warning. On the GPU machine, after ../shared/device/stage-wheels --tf --nccl, from the repository root:

    source bench/gpu/env.sh; python3 -m hydrali.bench.gpu.acceptance --tier quick [--cifar-tgz .devdata/cifar10.tgz]

Logs, summaries and the table's JSON go to $OUT/acceptance/ (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROWS_FILE = Path(__file__).with_name("acceptance.yaml")
BACKENDS = ("lightning", "keras")
GPU_COUNTS = (1, 2)  # trained by default: each count above 1 is compared with 1 GPU
MORE_GPU_COUNTS = (1, 2, 4)  # what --gpu-counts takes (4 on a 4-GPU machine)
STREAM_WARNING = "AccumulateGrad node's stream does not match"


@dataclass
class Result:
    """One training run of a row: its best validation value, training seconds and images/s (None: it failed)."""

    best: float | None
    train_seconds: float | None
    images_per_second: float | None
    stream_warning: bool
    log: str


@dataclass
class Side:
    """The runs of one row, backend and GPU count, one per seed."""

    results: list[Result] = field(default_factory=list)

    def values(self) -> list[float]:
        """The best validation values of the runs that finished."""
        return [r.best for r in self.results if r.best is not None]

    def mean(self, attribute: str) -> float | None:
        """The mean of `attribute` over the runs that finished (None if none did)."""
        values = [getattr(r, attribute) for r in self.results if getattr(r, attribute) is not None]
        return statistics.fmean(values) if values else None


def rows_of(tier: str, only: list[str] | None) -> tuple[list[dict], list[int]]:
    """The rows of acceptance.yaml in `tier` (or named in `only`), and the seeds list."""
    spec = yaml.safe_load(ROWS_FILE.read_text())
    rows = [r for r in spec["rows"] if tier in r["tiers"] and (not only or r["name"] in only)]
    return rows, list(spec["seeds"])


def command(row: dict, backend: str, gpus: int, seed: int, run_dir: Path, cifar_root: str) -> list[str]:
    """The hydrali command of one run of `row`."""
    overrides = [o.replace("${cifar_root}", cifar_root) for o in row["overrides"]]
    batch = [] if row["global_batch"] is None else [f"data.global_batch={row['global_batch']}"]
    quiet = "progress_bar=false"
    return [
        sys.executable,
        "-m",
        "hydrali.core",
        *overrides,
        *batch,
        f"backend={backend}",
        f"backend.devices={gpus}",
        f"seed={seed}",
        quiet,
        "tracking=none",
        f"hydra.run.dir={run_dir}",
    ]


def train(cmd: list[str], backend: str, run_dir: Path) -> Result:
    """Run one hydrali command to its end: its Result read from its summary.json and its log."""
    env = dict(os.environ)
    if backend == "keras" and os.environ.get("TF_LIBS"):  # TensorFlow's libraries (bench/gpu/env.sh), not torch's
        env["LD_LIBRARY_PATH"] = os.environ["TF_LIBS"]
    log = run_dir.with_suffix(".log")
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier check's run there would be reported as finished
    with open(log, "w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    text = log.read_text(errors="replace")
    summary_file = run_dir / "summary.json"
    if code != 0 or not summary_file.is_file():
        print(f"  failed (exit {code}): {log}\n" + "\n".join(text.splitlines()[-15:]), flush=True)
        return Result(None, None, None, STREAM_WARNING in text, str(log))
    summary = json.loads(summary_file.read_text())
    best = summary["best"][summary["monitor"]]
    return Result(best, summary["train_seconds"], summary["images_per_second"], STREAM_WARNING in text, str(log))


ALONE = ("1 GPU only", "N GPUs only")  # verdicts of a row run on one side only, its runs finished above its floor


def under_floor(row: dict, side: Side) -> str | None:
    """Why `side`'s mean best is below the row's `floor` (the accuracy it reaches on one GPU less a few points: a
    regression that hits every GPU count alike), or None (no floor, no runs, or at or above it)."""
    floor = row.get("floor")
    if floor is None or not side.values() or side.mean("best") >= floor:
        return None
    return f"UNDER {floor} ({side.mean('best'):.4f})"


def verdict(row: dict, one: Side, many: Side) -> str:
    """'ok', or why the row fails: a failed run, a stream warning, a mean under the row's floor, or N GPUs (`many`)
    below 1 GPU by more than the tolerance ('1 GPU only' / 'N GPUs only' where one side alone was asked for and its
    runs finished above the floor)."""
    if not one.results and not many.results:
        return "NO RUNS"
    if not one.results or not many.results:
        ran = one if one.results else many
        if len(ran.values()) < len(ran.results):
            return "FAILED RUN"
        return under_floor(row, ran) or (ALONE[0] if one.results else ALONE[1])
    if len(one.values()) < len(one.results) or len(many.values()) < len(many.results):
        return "FAILED RUN"
    low = under_floor(row, one) or under_floor(row, many)
    if low:
        return low
    if any(r.stream_warning for r in many.results):
        return "STREAM WARNING"
    if many.mean("best") < one.mean("best") - row["tolerance"]:
        return f"BELOW by {one.mean('best') - many.mean('best'):.4f}"
    return "ok"


def compared(counts: list[int]) -> list[tuple[int, int]]:
    """The (1, N) pairs a check of `counts` compares: 1 GPU with each count above it; (N, N) for a count run alone."""
    many = [g for g in counts if g > 1]
    if 1 in counts and many:
        return [(1, g) for g in many]
    return [(g, g) for g in counts]


def spread(side: Side) -> str:
    """The side's values as `mean` or `mean (min-max)` over several seeds."""
    values = side.values()
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ({min(values):.4f}-{max(values):.4f})"


def number(value: float | None, digits: int = 1) -> str:
    """A number for the table, '-' for none."""
    return "-" if value is None else f"{value:,.{digits}f}"


def table(rows: list[dict], sides: dict, backends: list[str], counts: tuple[int, ...] = GPU_COUNTS) -> str:
    """The check's table in Markdown: a line per row, backend and GPU count compared with 1 GPU."""
    lines = [
        "| row | backend | GPUs | seeds (1 / N GPUs) | 1 GPU best | N GPUs best | tolerance | 1 GPU s | N GPUs s "
        "| 1 GPU img/s | N GPUs img/s | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        for backend in backends:
            for first, second in compared(counts):
                one, many = sides[row["name"], backend, 1], sides[row["name"], backend, second]
                if first == second:  # one count alone: its values, nothing compared
                    one, many = (many, Side()) if second == 1 else (Side(), many)
                lines.append(
                    f"| {row['name']} | {backend} | {second} | {len(one.results)} / {len(many.results)} | "
                    f"{spread(one)} | {spread(many)} | {row['tolerance']} | "
                    f"{number(one.mean('train_seconds'))} | {number(many.mean('train_seconds'))} | "
                    f"{number(one.mean('images_per_second'), 0)} | {number(many.mean('images_per_second'), 0)} | "
                    f"{verdict(row, one, many)} |"
                )
    return "\n".join(lines)


def unpack_cifar(tgz: str | None, where: Path) -> str:
    """CIFAR-10's image folder (../shared/data/cifar10.tgz, carried in the checkout), unpacked once under `where`."""
    root = where / "cifar"
    if not root.is_dir():
        if not tgz or not Path(tgz).is_file():
            raise SystemExit(
                f"acceptance: the cifar10 row needs --cifar-tgz (a copy of ../shared/data/cifar10.tgz): {tgz}"
            )
        with tarfile.open(tgz) as archive:
            archive.extractall(where, filter="data")
    return str(root)


def main(argv: list[str] | None = None) -> int:
    """Run the check's tier; 0 when every row holds, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tier",
        choices=["quick", "full"],
        default="quick",
        help="quick: the rows a change can affect, in a few minutes; full: every row, before an issue is resolved",
    )
    parser.add_argument("--rows", nargs="*", help="only these rows (names in acceptance.yaml)")
    parser.add_argument("--seeds", type=int, help="seeds per row and side (default: the row's for the tier)")
    parser.add_argument("--one-gpu-seeds", type=int, help="seeds on 1 GPU, the first of the 2-GPU ones (default: all)")
    parser.add_argument("--backends", nargs="*", default=list(BACKENDS), help="only these backends")
    parser.add_argument(
        "--gpu-counts",
        nargs="*",
        type=int,
        choices=MORE_GPU_COUNTS,
        default=list(GPU_COUNTS),
        help="the GPU counts to train on: each above 1 is compared with 1 GPU (1 2 4 on a 4-GPU machine); one count "
        "alone measures its spread over seeds (1: where a row's tolerance comes from), compares nothing, and exits 0 "
        "when every run finished",
    )
    parser.add_argument("--cifar-tgz", default=".devdata/cifar10.tgz", help="CIFAR-10's tgz, for the cifar10 row")
    parser.add_argument("--work", default="/tmp/acceptance", help="where runs and data go")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp/out"), "acceptance"))
    args = parser.parse_args(argv)
    rows, seeds = rows_of(args.tier, args.rows)
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    cifar_root = unpack_cifar(args.cifar_tgz, work) if any(r["name"] == "cifar10" for r in rows) else ""
    sides: dict = {(r["name"], b, g): Side() for r in rows for b in BACKENDS for g in MORE_GPU_COUNTS}
    started = time.monotonic()
    for row in rows:
        for backend in args.backends:
            for index, seed in enumerate(seeds[: args.seeds or row["seeds"][args.tier]]):
                for gpus in args.gpu_counts:
                    if gpus == 1 and args.one_gpu_seeds is not None and index >= args.one_gpu_seeds:
                        continue
                    run_dir = work / f"{row['name']}-{backend}-{gpus}gpu-seed{seed}"
                    cmd = command(row, backend, gpus, seed, run_dir, cifar_root)
                    result = train(cmd, backend, run_dir)
                    sides[row["name"], backend, gpus].results.append(result)
                    print(
                        f"acceptance: {row['name']} {backend} {gpus} GPU(s) seed {seed}: best {number(result.best, 4)}"
                        f", {number(result.train_seconds)} s, {number(result.images_per_second, 0)} images/s"
                        f"{', stream warning' if result.stream_warning else ''} ({time.monotonic() - started:.0f} s)",
                        flush=True,
                    )
    text = table(rows, sides, args.backends, args.gpu_counts)
    print(text)
    record = {f"{n}/{b}/{g}": [r.__dict__ for r in s.results] for (n, b, g), s in sides.items() if s.results}
    (out / "acceptance.json").write_text(json.dumps({"tier": args.tier, "runs": record}, indent=2))
    (out / "acceptance.md").write_text(text + "\n")
    failed = [
        (row["name"], backend, second)
        for row in rows
        for backend in args.backends
        for first, second in compared(args.gpu_counts)
        if first != second
        and verdict(row, sides[row["name"], backend, 1], sides[row["name"], backend, second]) != "ok"
        or first == second
        and verdict(row, Side(), sides[row["name"], backend, second]) not in ALONE
    ]
    print(f"acceptance: {'FAILED: ' + str(failed) if failed else 'every row holds'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
