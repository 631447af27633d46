"""Section 8 of hydrali-bench: a sweep's jobs one after another against the same jobs at once (issue 49).

The same sweep runs twice, each time as a whole `hydrali -m` command in a process of its own (as a user starts it):
with Hydra's basic launcher (hydra/launcher=basic, the baseline: one job after another, each on every GPU) and with
hydrali's launcher (the default of -m: jobs at once, each on a slot of GPUs). Per sweep: its wall time (measured
around the command), and from its jobs' summary.json files the GPU time they trained (each job's train_seconds x
the GPUs it used), the issue's bound on the wall time (BOUND_FACTOR x that GPU time / the machine's GPUs +
BOUND_SLACK_S), how much of the GPUs' wall time went to training, and each job's best metric, which the issue wants
within BEST_TOLERANCE of the same job on the other launcher.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hydrali.bench.scaling import SUMMARY, environment
from hydrali.bench.timing import Timing
from hydrali.core.cli.sweep_launcher import CONSOLE_SUFFIX
from hydrali.core.errors import HydraliError, first_line
from hydrali.core.run.run_dir import override_key

log = logging.getLogger("hydrali")

BOUND_FACTOR = 1.25  # issue 49: a parallel sweep's wall time at most 1.25 x its jobs' GPU time / the GPUs ...
BOUND_SLACK_S = 30.0  # ... + 30 s
BEST_TOLERANCE = 0.01  # issue 49: each job's best metric within 0.01 of the same job run alone
SEQUENTIAL, PARALLEL = "sequential", "parallel"  # the two sweeps (row keys, folders under the run dir)
BASIC_LAUNCHER = "hydra/launcher=basic"  # the baseline's launcher: Hydra's own, one job after another
LAUNCHER_KEYS = ("hydra.launcher", "hydra/launcher")  # overrides that only the parallel sweep's launcher takes
GPUS_KEY = "hydra.launcher.gpus"  # the parallel launcher's GPU ids
GPUS_PER_JOB_KEY = "hydra.launcher.gpus_per_job"
# the first line of a parallel job's console log, as hydrali's launcher writes it (core/cli/sweep_launcher.py)
CONSOLE_FIRST_LINE = re.compile(r"hydrali: job (\d+) on GPUs (\S*):")
OUTPUT_SUFFIX = ".log"  # each sweep's command line and output, beside its sweep dir
COMMAND_PROMPT = "$ "  # before the command line, on the first line of that file


def launcher_only(overrides: list[str]) -> tuple[list[str], list[str]]:
    """`overrides` split into those both sweeps take and those of the parallel sweep's launcher (hydra.launcher.*,
    which Hydra's basic launcher has no key for), each in its order."""
    mine = [o for o in overrides if override_key(o).startswith(LAUNCHER_KEYS)]
    return [o for o in overrides if o not in mine], mine


def given_gpu_ids(overrides: list[str]) -> list[str]:
    """The GPU ids `overrides` give the parallel launcher (its last hydra.launcher.gpus), or [] where they give
    none (or auto)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydrali.core.distributed.gpu_placement import AUTO, visible_gpus

    given = [o for o in overrides if override_key(o) == GPUS_KEY]
    if not given:
        return []
    value = OverridesParser.create().parse_override(given[-1]).value()
    if str(value).lower() == AUTO:
        return []
    return visible_gpus(value, lambda: 0)


def job_count(grid: str) -> int:
    """How many jobs the swept overrides `grid` (space-separated) make: the product of their values' counts."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(grid.split())
        counts = [len(list(o.sweep_string_iterator())) for o in parsed if o.is_sweep_override()]
    except Exception as err:  # noqa: BLE001 - Hydra's parse errors have no common type
        raise HydraliError(f"bench.sweep.grid={grid}: {first_line(err)}") from err
    if not counts:
        raise HydraliError(f"bench.sweep.grid={grid}: give a swept override, e.g. optim.lr=0.05,0.1,0.2,0.4")
    return math.prod(counts)


@dataclass(frozen=True)
class Job:
    """One finished job of a sweep, from its summary.json (and its console log's first line)."""

    number: int
    gpus: int  # the GPUs it trained on
    train_seconds: float
    best: float | None  # its best value of the metric it monitored
    train_images: int
    wall_seconds: float = 0.0  # from its start to its summary
    wall_parts: dict = dataclasses.field(default_factory=dict)  # where that time went (summary.json's wall_parts)

    def parts_line(self) -> str:
        """Its wall time and its parts, e.g. `wall 31.2 s: startup 0.0, data_check 2.4, build 0.7, ...`."""
        parts = ", ".join(f"{name.removesuffix('_s')} {seconds:.1f}" for name, seconds in self.wall_parts.items())
        return f"wall {self.wall_seconds:.1f} s" + (f": {parts}" if parts else "")


@dataclass(frozen=True)
class SweepResult:
    """One sweep: its wall time, its jobs, and the GPUs of the machine it ran on."""

    wall_seconds: float
    jobs: tuple[Job, ...]
    machine_gpus: int  # G: the GPUs the machine offers (on one without a GPU: the ids the sweep was given)

    @property
    def gpu_seconds(self) -> float:
        """The GPU time its jobs trained: each job's train_seconds x its GPUs, summed."""
        return sum(job.train_seconds * job.gpus for job in self.jobs)

    @property
    def bound_seconds(self) -> float:
        """The issue's bound on its wall time: BOUND_FACTOR x its GPU time / G + BOUND_SLACK_S."""
        return BOUND_FACTOR * self.gpu_seconds / self.machine_gpus + BOUND_SLACK_S

    @property
    def efficiency(self) -> float:
        """The share of the G GPUs' wall time that its jobs spent training."""
        return self.gpu_seconds / (self.machine_gpus * self.wall_seconds)

    @property
    def within_bound(self) -> bool:
        """Whether its wall time is within the issue's bound."""
        return self.wall_seconds <= self.bound_seconds

    @property
    def images_per_s(self) -> float:
        """Every job's training images over its wall time."""
        return sum(job.train_images for job in self.jobs) / self.wall_seconds

    def as_dict(self) -> dict:
        """Its figures, for the JSON."""
        return {
            "wall_seconds": round(self.wall_seconds, 3),
            "jobs": len(self.jobs),
            "gpu_seconds": round(self.gpu_seconds, 3),
            "machine_gpus": self.machine_gpus,
            "bound_seconds": round(self.bound_seconds, 3),
            "efficiency": round(self.efficiency, 4),
            "within_bound": self.within_bound,
            "images_per_s": round(self.images_per_s, 1),
            "per_job": [dataclasses.asdict(job) for job in self.jobs],
        }


def job_gpus(sweep_dir: Path, number: int, summary: dict) -> int:
    """The GPUs job `number` of the sweep in `sweep_dir` trained on: the ids on its console log's first line (a
    job of a parallel sweep), else its summary's world_size."""
    console = sweep_dir / f"{number}{CONSOLE_SUFFIX}"
    if console.is_file():
        with console.open() as lines:
            match = CONSOLE_FIRST_LINE.match(lines.readline())
        if match and match.group(2):
            return len(match.group(2).split(","))
    return int(summary["world_size"])


def read_jobs(sweep_dir: Path, jobs: int) -> tuple[Job, ...]:
    """The `jobs` finished jobs of the sweep in `sweep_dir` (job dirs 0..jobs-1, each with its summary.json)."""
    out = []
    for number in range(jobs):
        path = sweep_dir / str(number) / SUMMARY
        if not path.is_file():
            raise HydraliError(f"{path} is missing: job {number} of the sweep did not finish")
        summary = json.loads(path.read_text())
        out.append(
            Job(
                number=number,
                gpus=job_gpus(sweep_dir, number, summary),
                train_seconds=float(summary["train_seconds"]),
                best=summary["best"].get(summary["monitor"]),
                train_images=int(summary["train_images"]),
                wall_seconds=float(summary.get("wall_seconds", 0.0)),
                wall_parts=dict(summary.get("wall_parts") or {}),
            )
        )
    return tuple(out)


class SweepRun:
    """One `hydrali -m` command; once() = one sweep in a new sweep dir, its every job's training images per second
    of its wall time (its figures kept in `results`)."""

    def __init__(
        self,
        launcher: str,
        overrides: list[str],
        grid: str,
        launcher_overrides: list[str],
        run_dir: Path,
        machine_gpus: int,
        library_path: str | None = None,
    ):
        self.launcher, self.overrides, self.grid = launcher, list(overrides), grid
        self.launcher_overrides = list(launcher_overrides)  # its launcher's own (after the others)
        self.run_dir, self.machine_gpus, self.library_path = Path(run_dir), int(machine_gpus), library_path
        self.jobs = job_count(grid)
        self.repeat = 0
        self.results: list[SweepResult] = []  # every repeat's, in order

    def command(self, sweep_dir: Path) -> list[str]:
        """The command line of one sweep into `sweep_dir`."""
        return [
            sys.executable,
            "-m",
            "hydrali.core",
            "-m",
            *self.overrides,
            *self.grid.split(),
            f"hydra.sweep.dir={sweep_dir}",
            *self.launcher_overrides,
        ]

    def once(self) -> Timing:
        """Run the sweep once in a new sweep dir (its command line and output in a file beside it); its jobs'
        training images per second of its wall time. Each job's GPUs, training time and best are logged."""
        self.repeat += 1
        while (self.run_dir / f"r{self.repeat}").exists():  # a benchmark run again in the same dir: new sweeps
            self.repeat += 1
        sweep_dir = self.run_dir / f"r{self.repeat}"
        output = self.run_dir / f"r{self.repeat}{OUTPUT_SUFFIX}"
        output.parent.mkdir(parents=True, exist_ok=True)
        command = self.command(sweep_dir)
        started = time.monotonic()
        with output.open("w") as sink:
            sink.write(f"{COMMAND_PROMPT}{shlex.join(command)}\n")
            sink.flush()
            done = subprocess.run(command, env=environment(self.library_path), stdout=sink, stderr=subprocess.STDOUT)
        wall = time.monotonic() - started
        if done.returncode != 0:
            tail = output.read_text().strip().splitlines()[-1]
            raise HydraliError(f"the {self.launcher} sweep failed ({done.returncode}; {output}): {tail}")
        result = SweepResult(wall, read_jobs(sweep_dir, self.jobs), self.machine_gpus)
        self.results.append(result)
        for job in result.jobs:
            log.info(
                "bench: sweep, %s launcher, repeat %d: job %d on %d GPU(s), %.1f s of training, best %s; %s",
                self.launcher,
                self.repeat,
                job.number,
                job.gpus,
                job.train_seconds,
                "-" if job.best is None else f"{job.best:.4f}",
                job.parts_line(),
            )
        return Timing(result.images_per_s)


def largest_best_difference(ours: list[SweepResult], theirs: list[SweepResult]) -> float | None:
    """The largest difference between a job's best on one launcher and the same job's (same number, same repeat)
    on the other; None where no job has a best on both."""
    differences = [
        abs(a.best - b.best)
        for mine, other in zip(ours, theirs)
        for a, b in zip(mine.jobs, other.jobs)
        if a.best is not None and b.best is not None
    ]
    return max(differences, default=None)


@dataclass
class Figures:
    """A sweep row's figures: the medians over its repeats (each repeat's kept whole), for the table and the JSON;
    against the baseline sweep's `baseline` results where given (None: this is the baseline, or the baseline failed)."""

    results: list[SweepResult]
    baseline: list[SweepResult] | None = None
    is_baseline: bool = False

    @property
    def speedup(self) -> float | None:
        """The baseline's median wall time over this sweep's (None without a baseline)."""
        if not self.baseline:
            return None
        return median_of(self.baseline, "wall_seconds") / median_of(self.results, "wall_seconds")

    @property
    def best_difference(self) -> float | None:
        """largest_best_difference against the baseline (None without one)."""
        return largest_best_difference(self.results, self.baseline) if self.baseline else None

    def notes(self) -> dict:
        """Everything measured of this sweep, for the JSON: its medians, every repeat's figures and jobs."""
        per_job = {}
        for job in self.results[0].jobs:
            bests = [r.jobs[job.number].best for r in self.results if r.jobs[job.number].best is not None]
            per_job[job.number] = statistics.median(bests) if bests else None
        difference = self.best_difference
        return {
            "baseline": self.is_baseline,
            "wall_seconds": median_of(self.results, "wall_seconds"),
            "jobs": len(self.results[0].jobs),
            "gpu_seconds": median_of(self.results, "gpu_seconds"),
            "machine_gpus": self.results[0].machine_gpus,
            "bound_seconds": median_of(self.results, "bound_seconds"),
            "efficiency": median_of(self.results, "efficiency"),
            "repeats": len(self.results),
            "repeats_within_bound": sum(r.within_bound for r in self.results),
            "best_per_job": per_job,
            "largest_best_difference": difference,
            "best_within_tolerance": None if difference is None else difference <= BEST_TOLERANCE,
            "speedup": self.speedup,
            "runs": [r.as_dict() for r in self.results],
        }

    def cells(self) -> list[str]:
        """The row's cells under section 8's own columns (hydrali.bench.report.OWN_COLUMNS), after its device."""
        n, repeats = self.notes(), len(self.results)
        within = "yes" if n["repeats_within_bound"] == repeats else "no"
        if repeats > 1:
            within += f" ({n['repeats_within_bound']} of {repeats} repeats)"
        bests = ", ".join(f"{job}: {'-' if b is None else f'{b:.4f}'}" for job, b in n["best_per_job"].items())
        difference, speedup = n["largest_best_difference"], n["speedup"]
        if difference is not None:
            verdict = "within" if n["best_within_tolerance"] else "beyond"
            difference = f"{difference:.4f} ({verdict} {BEST_TOLERANCE})"
        return [
            f"{n['wall_seconds']:,.1f}",
            str(n["jobs"]),
            f"{n['gpu_seconds']:,.1f}",
            str(n["machine_gpus"]),
            f"{n['bound_seconds']:,.1f}",
            f"{n['efficiency']:.2f}",
            within,
            bests,
            "(baseline)" if self.is_baseline else difference or "-",
            "(baseline)" if self.is_baseline else "-" if speedup is None else f"{speedup:.2f}x",
        ]


def median_of(results: list[SweepResult], figure: str) -> float:
    """The median of one figure (a SweepResult property) over `results`."""
    return statistics.median(getattr(r, figure) for r in results)
