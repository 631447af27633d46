"""Where a run's wall time goes: its parts, timed on the process that writes the summary, summing to the wall time.

The wall time runs from the run's start to its summary. A run's start is its process's own start (as the kernel
recorded it: the interpreter's start and every import are counted) for the first run of a process that exists to run
hydrali (the `hydrali` command: core/cli/main.py says so; a process hydrali's launcher started for a job; a rank
that torchrun or srun started with the `hydrali` command); for a later job of a sweep in the same process, or a run
called from Python, it is the call of core.run.runner.run.

The parts (`WallParts`), each in seconds:
- startup: the run's start to its first stage (Python, imports, Hydra's composition, the config's checks and the
  run dir), and loading the backend (importing torch or TensorFlow);
- data_check: the task built and its data prepared and checked (data.verify);
- build: DALI's pipelines, the network and the framework's trainer built: pipeline.autotune's probes, and
  backend.fit's start to its first epoch's start;
- first_step: the first epoch's start to the end of its first training step (loaders starting; with
  backend.compile the compile warm-up, torch.compile or XLA);
- training: every other training step, from each epoch's start to its validation or its end;
- validation: each validation, from its start to the next training step or the epoch's end as the backend reports
  it (on Keras that end comes after the epoch's checkpoint is saved);
- tracking: the tracking server's check (tracking.uri), the run's MLflow run opened (and run.json written), its
  params, config and artifacts logged, and the run ended (the metrics of each epoch, logged as it ends, are not);
- other: what remains: the plan, the resume point, the run's `auto` settings, the checkpoints a framework saves after
  the epoch's end as its backend reports it (a checkpoint saved before that end counts in validation), each epoch's
  record, the end of backend.fit, the summary.

With hydrali's own launcher (several processes on one node), the summary is rank 0's: its parts are rank 0's
process's, started by the job's process after that one's own start-up and data check, which are not counted.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from hydrali.core.run.results import FitResult

STARTUP, DATA_CHECK, BUILD, TRACKING = "startup", "data_check", "build", "tracking"  # parts the runner times
_STAT_FIELDS_BEFORE_STATE = 2  # /proc/<pid>/stat: pid, (comm), then the state, field 3 of proc(5)
_STARTTIME_FIELD = 22  # proc(5): the process's start, in clock ticks since boot
_process = {"started": None}  # perf_counter() at this process's start, until its first run takes it


def process_started() -> float:
    """time.perf_counter()'s reading at this process's start, from the kernel's record of it (Linux); now where
    there is none."""
    now = time.perf_counter()
    try:
        return now - _process_age_seconds()
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc, or no CLOCK_BOOTTIME
        return now


def _process_age_seconds() -> float:
    """Seconds since the kernel started this process."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # after the command's name
    ticks = int(fields[_STARTTIME_FIELD - _STAT_FIELDS_BEFORE_STATE - 1])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


@contextmanager
def counted_from_process_start() -> Iterator[None]:
    """Within it, this process exists to run hydrali (its command line): the wall time of its first run counts from
    the process's own start."""
    _process["started"] = process_started()
    try:
        yield
    finally:
        _process["started"] = None


def run_started(*, whole_process: bool = False) -> float:
    """time.perf_counter()'s reading at this run's start: the process's start for its first run within
    counted_from_process_start, or when `whole_process` (a process started for this run); now otherwise."""
    started, _process["started"] = _process["started"], None
    if started is None and whole_process:
        started = process_started()
    return started if started is not None else time.perf_counter()


@dataclass
class RunClock:
    """A run's start, the seconds of the parts the runner times itself (STARTUP, DATA_CHECK, BUILD, TRACKING), and
    when backend.fit was called."""

    started: float
    seconds: dict[str, float] = field(default_factory=dict)
    fit_called: float | None = None

    @contextmanager
    def timing(self, part: str) -> Iterator[None]:
        """Add the time of the `with` block to `part`."""
        begun = time.perf_counter()
        try:
            yield
        finally:
            self.add(part, time.perf_counter() - begun)

    def add(self, part: str, seconds: float) -> None:
        """Count `seconds` more in `part`."""
        self.seconds[part] = self.seconds.get(part, 0.0) + seconds

    def since_start(self) -> float:
        """Seconds from the run's start to now."""
        return time.perf_counter() - self.started

    def fit_starts(self) -> None:
        """backend.fit is called now."""
        self.fit_called = time.perf_counter()


@dataclass(frozen=True)
class WallParts:
    """A run's wall time in parts, in seconds (this module's docstring says what each holds); they sum to it."""

    startup_s: float
    data_check_s: float
    build_s: float
    first_step_s: float
    training_s: float
    validation_s: float
    tracking_s: float
    other_s: float

    def as_dict(self, digits: int) -> dict[str, float]:
        """The parts by name, rounded to `digits` decimals."""
        return {name: round(seconds, digits) for name, seconds in asdict(self).items()}


def wall_parts(clock: RunClock, result: FitResult, wall_seconds: float) -> WallParts:
    """The parts of `wall_seconds` from what the runner timed (`clock`) and what the backend's observer timed
    (`result`): `other` is what the rest leave."""
    first_step = result.first_step_seconds or 0.0
    fit_setup = (
        result.training_started - clock.fit_called
        if result.training_started is not None and clock.fit_called is not None
        else 0.0
    )
    timed = {
        "startup_s": clock.seconds.get(STARTUP, 0.0),
        "data_check_s": clock.seconds.get(DATA_CHECK, 0.0),
        "build_s": clock.seconds.get(BUILD, 0.0) + fit_setup,
        "first_step_s": first_step,
        "training_s": result.train_seconds - first_step,
        "validation_s": result.validation_seconds,
        "tracking_s": clock.seconds.get(TRACKING, 0.0),
    }
    return WallParts(**timed, other_s=wall_seconds - sum(timed.values()))
