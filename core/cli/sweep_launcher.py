"""hydrali's default launcher of a sweep (`-m`, conf/hydra/launcher/hydrali.yaml): on a machine with several GPUs its
jobs run at once, each on GPUs of its own; with one GPU or none, one after another in this process, as Hydra's basic
launcher runs them.

The parallel jobs run as Hydra's joblib launcher runs its jobs (its execute_job), in the worker processes of loky's
reusable pool (joblib's; reused between jobs, so that a worker keeps its imports, and never this process, even for
one job): each worker takes a slot of GPUs once, for its life (hydrali.core.distributed.gpu_placement), and takes the
next job as soon as its last one ended. A worker runs jobs of one backend only (torch's compiler in a process that
ran TensorFlow crashes it): a sweep over backends runs each backend's jobs in a pool of its own, one backend after the
other. Each job's console output goes to `<job dir>.console.log` beside its dir (its hydrali.log holds its log as
always); this process prints a line as each job ends. A worker that dies (the out-of-memory killer, a crash in a
library) makes loky stop the pool's other workers too: the jobs they ran run again, each by itself (so that a death
names its job), and resume from their checkpoints; a job whose worker dies while it runs alone is a failed job.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import signal
import sys
import time
from concurrent.futures import as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hydrali.core.cli.exit_codes import EXIT_FAILED_SWEEP, EXIT_INTERRUPTED
from hydrali.core.distributed import gpu_placement
from hydrali.core.distributed.device_count import devices_setting

log = logging.getLogger("hydrali")
BACKEND_GROUP, DEVICES_KEY = "backend", "backend.devices"
CONSOLE_SUFFIX = ".console.log"  # a parallel job's console output, beside its dir
LOKY_MEMORY_GUARD = "_MAX_MEMORY_LEAK_SIZE"  # loky's process_executor: the growth past which it replaces a worker
_pool: dict = {"backend": None}  # the backend the workers of this process's pool ran (kept between launch calls)


class HydraliLauncher(Launcher):
    """Jobs at once on GPUs of their own where the machine has several, else one after another (Hydra's basic
    launcher)."""

    def __init__(self, gpus: Any = gpu_placement.AUTO, gpus_per_job: int = 1) -> None:
        self.gpus, self.gpus_per_job = gpus, int(gpus_per_job)
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep what launch needs (Hydra's Launcher interface)."""
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Run the jobs (Hydra's Launcher interface): their JobReturns in the order given."""
        per_job = job_gpus(self.config, job_overrides, self.gpus_per_job)
        placement = gpu_placement.plan(gpu_placement.visible_gpus(self.gpus, gpu_placement.count_gpus), per_job)
        if not placement.parallel:
            from hydra._internal.core_plugins.basic_launcher import BasicLauncher

            if str(self.gpus).lower() != gpu_placement.AUTO and placement.slots[0]:  # GPUs named: only those
                os.environ[gpu_placement.CUDA_VISIBLE_DEVICES] = ",".join(placement.slots[0])

            basic = BasicLauncher()
            basic.setup(hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
            return basic.launch(job_overrides, initial_job_idx)
        return self._parallel(placement, job_overrides, initial_job_idx)

    def _parallel(self, placement, job_overrides, initial_job_idx: int) -> list[JobReturn]:
        from hydra.core.singleton import Singleton
        from hydra.core.utils import setup_globals
        from joblib.externals.loky import get_reusable_executor
        from joblib.externals.loky.process_executor import TerminatedWorkerError

        from hydrali.core.tracking import sweep

        setup_globals()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        os.environ.update(gpu_placement.offer(placement, sweep_dir))  # the workers start with it
        first, last = initial_job_idx, initial_job_idx + len(job_overrides) - 1
        print(f"hydrali: jobs {first}-{last} of the sweep: {placement.describe()}", flush=True)
        state = Singleton.get_state()
        returns: dict[int, JobReturn] = {}
        exits: list[int] = []
        with stops_passed_on(sweep_dir, self.config) as stop:
            for backend, indices in by_backend(self.config, job_overrides).items():
                if stop["signal"] is not None or exits:
                    break
                if _pool["backend"] not in (None, backend):  # a fresh pool: a worker runs one backend
                    get_reusable_executor().shutdown(wait=True)
                _pool["backend"] = backend
                pending, alone = list(indices), []  # alone: the jobs a dead worker took with it, each run by itself
                deaths_unnamed = 0
                while pending and stop["signal"] is None and not exits:
                    batch = alone[:1] or pending
                    executor = get_reusable_executor(max_workers=min(len(placement.slots), len(batch)))
                    # no more workers than jobs (an idle worker is one more to stop); never in this process
                    futures = [
                        executor.submit(
                            run_in_worker,
                            initial_job_idx + i,
                            backend,
                            job_overrides[i],
                            self.hydra_context,
                            self.config,
                            self.task_function,
                            state,
                        )
                        for i in batch
                    ]
                    try:
                        for future in as_completed(futures):
                            ended = future.result()
                            pending.remove(ended.index - initial_job_idx)
                            if alone and alone[0] == ended.index - initial_job_idx:
                                alone.pop(0)
                            sweep.add_failed_elsewhere(ended.failed)
                            if ended.exit_code is not None:
                                exits.append(ended.exit_code)
                                gpu_placement.ask_to_stop(sweep_dir)  # as a single job's exit ends a sweep
                            if ended.ret is not None:
                                returns[ended.index] = ended.ret
                            if ended.started:
                                print(ended_line(ended, self.config.get("optimized_metric")), flush=True)
                    except TerminatedWorkerError as died:  # loky stops every worker of the pool when one dies
                        taken = [job - initial_job_idx for job in gpu_placement.left_running(sweep_dir)]
                        how = worker_death(died)
                        if alone:  # it ran by itself: the death was its own
                            position = alone.pop(0)
                            pending.remove(position)
                            returns[initial_job_idx + position] = dead_job_return(job_overrides[position])
                            sweep.add_failed_elsewhere(1)
                            print(
                                f"hydrali: job {initial_job_idx + position} failed: its worker process died ({how})",
                                flush=True,
                            )
                            record_dead_job(
                                self.config, sweep_dir, initial_job_idx + position, f"its worker process died ({how})"
                            )
                            continue
                        alone = [position for position in pending if position in taken]
                        deaths_unnamed = 0 if alone else deaths_unnamed + 1
                        if deaths_unnamed > 1:  # workers die with no job running: nothing a job can fix
                            raise
                        jobs_taken = ", ".join(str(initial_job_idx + p) for p in alone) or "none"
                        print(
                            f"hydrali: a worker process died ({how}) while jobs {jobs_taken} ran (the pool's other "
                            "workers are stopped with it): each runs again by itself, from its last checkpoint",
                            flush=True,
                        )
        if stop["signal"] is not None or exits:
            get_reusable_executor().shutdown(wait=True)  # no worker outlives a stopped sweep
        if stop["signal"] is not None:
            raise KeyboardInterrupt  # hydrali's main closes the sweep as KILLED; each stopped job resumes
        if exits:
            raise SystemExit(exits[0])
        return [returns[initial_job_idx + i] for i in range(len(job_overrides))]


@contextlib.contextmanager
def stops_passed_on(sweep_dir: Path, config: DictConfig):
    """While a parallel sweep runs: Ctrl+C (SIGINT, which a terminal gives every worker too), SIGTERM (which a
    scheduler gives this process only: passed on to the workers as SIGINT) and the run's preemption signals
    (preemption.signals, passed on as they are: each job saves where it is) stop it: its workers start no further
    job, each running job stops as it would alone (KILLED, resumable), and once they ended the sweep ends as
    interrupted. Yields {"signal": the signal received, or None}."""
    stop: dict = {"signal": None}
    preemption = {signal.Signals[str(name)] for name in OmegaConf.select(config, "preemption.signals", default=[])}
    relayed = {signal.SIGTERM: signal.SIGINT, **{s: s for s in preemption}}

    def on_signal(signum, frame):
        first = stop["signal"] is None
        stop["signal"] = signum
        gpu_placement.ask_to_stop(sweep_dir)
        if first:
            print("hydrali: stopping the sweep: its running jobs stop and can be resumed", file=sys.stderr, flush=True)
        if signum in relayed:
            for pid in gpu_placement.holders(sweep_dir):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, relayed[signum])

    watched = {signal.SIGINT, signal.SIGTERM, *preemption}
    previous = {s: signal.signal(s, on_signal) for s in watched}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _override(overrides: Sequence[str], key: str) -> str | None:
    """The value `overrides` give `key` (the last one), or None."""
    from hydrali.core.run.run_dir import override_key

    values = [o.split("=", 1)[1] for o in overrides if "=" in o and override_key(o) == key]
    return values[-1] if values else None


def job_gpus(config: DictConfig, job_overrides: Sequence[Sequence[str]], default: int) -> int:
    """The GPUs a slot holds: the most any job's backend.devices asks for; `default` (hydra.launcher.gpus_per_job)
    for a job whose backend.devices is auto."""
    base = config.backend.get("devices", gpu_placement.AUTO) if "backend" in config else gpu_placement.AUTO
    counts = []
    for overrides in job_overrides:
        value = _override(overrides, DEVICES_KEY)
        counts.append(devices_setting(value if value is not None else base) or default)
    return max(counts, default=default)


def by_backend(config: DictConfig, job_overrides: Sequence[Sequence[str]]) -> dict[str, list[int]]:
    """The jobs' positions grouped by backend (its name), in the order each backend first appears."""
    chosen = str(config.hydra.runtime.choices.get(BACKEND_GROUP, "")) if "hydra" in config else ""
    groups: dict[str, list[int]] = {}
    for index, overrides in enumerate(job_overrides):
        groups.setdefault(_override(overrides, BACKEND_GROUP) or chosen, []).append(index)
    return groups


@dataclass
class Ended:
    """What a worker hands back of one job."""

    index: int
    ret: JobReturn | None  # None: it did not start (the sweep was stopping), or it exited (exit_code)
    gpus: tuple[str, ...] | None
    seconds: float
    failed: int  # jobs the worker counted as failed (0 or 1)
    started: bool = True
    exit_code: int | None = None  # the job ended its process's work with SystemExit (Ctrl+C: 130)


def run_in_worker(idx: int, backend: str, overrides, hydra_context, config, task_function, singleton_state) -> Ended:
    """One job of `backend` in a worker process: its slot's GPUs taken first (before any CUDA library reads them),
    the backend's framework imported meanwhile (a fresh worker's first job checks its data as it imports), its
    console output to its console log; what happened back to the launcher. Nothing starts once the sweep is
    stopping."""
    from hydra_plugins.hydra_joblib_launcher._core import execute_job

    from hydrali.core.contracts.registry import import_ahead
    from hydrali.core.process import collector
    from hydrali.core.tracking import sweep

    gpus, started, failed_before = None, time.monotonic(), sweep.failed_here()
    ret, code = None, None
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl+C stops the job this worker runs now
    try:
        gpus = gpu_placement.take()
        if gpu_placement.stopping():
            return Ended(idx, None, gpus, 0.0, 0, started=False)
        first = import_ahead(backend) is not None  # once a worker: its GPUs are fixed now
        keep_worker_memory()
        console = Path(str(config.hydra.sweep.dir)) / f"{idx}{CONSOLE_SUFFIX}"
        with output_to(console):
            line = f"hydrali: job {idx} on GPUs {','.join(gpus or ())}: {' '.join(filter_overrides(overrides))}"
            print(line, flush=True)
            try:
                with gpu_placement.running(idx), collector.worker_job(first=first):  # a worker's death leaves the mark
                    ret = execute_job(idx, overrides, hydra_context, config, task_function, singleton_state)
            except SystemExit as stop:  # a job stopped by Ctrl+C (130) or a preemption signal ends as its run says
                code = stop.code if isinstance(stop.code, int) and stop.code else EXIT_FAILED_SWEEP
    except KeyboardInterrupt:  # outside the run's own handling (its set-up, its end): the job is interrupted
        code = EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # an idle worker outlives a Ctrl+C: the launcher stops the pool
    return Ended(idx, ret, gpus, time.monotonic() - started, sweep.failed_here() - failed_before, exit_code=code)


def keep_worker_memory() -> None:
    """Keep this worker for the sweep's next jobs whatever memory its jobs keep. Where psutil is installed, loky ends a
    worker whose memory grew past its size after its first job by 300 MB (its guard against leaks; no public
    setting) and starts a fresh one, which imports, checks and decodes everything again; a worker keeps
    its decoded splits for its next job on purpose, at most one per split (core/data/decoded.py)."""
    from joblib.externals.loky import process_executor

    if getattr(process_executor, LOKY_MEMORY_GUARD, None) is not None:
        setattr(process_executor, LOKY_MEMORY_GUARD, sys.maxsize)


def worker_death(died: Exception) -> str:
    """Why a worker process died, in a few words, from loky's error (its exit codes)."""
    codes = re.search(r"exit codes of the workers are (\{[^}]*\})", str(died))
    cause = f"exit codes {codes.group(1)}" if codes else "an unexpected end"
    return f"{cause}: the system's out-of-memory killer, or a crash in a library"


def dead_job_return(overrides: Sequence[str]) -> JobReturn:
    """The JobReturn of a job whose worker died: a failed job, as a sweeper sees one (no value)."""
    from hydrali.core.tracking.sweep import FAILED_VALUE

    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = FAILED_VALUE
    return ret


def record_dead_job(config: DictConfig, sweep_dir: Path, job: int, how: str) -> None:
    """Mark the MLflow child run of job `job`, whose worker died (it could not close its run), FAILED with `how`."""
    from hydrali.core.tracking import sweep

    store = sweep.SweepStore.from_config(config.tracking, str(sweep_dir)) if "tracking" in config else None
    if store is None:
        return
    try:
        job_config = copy.deepcopy(config)
        with read_write(job_config.hydra.job), open_dict(job_config.hydra.job):
            job_config.hydra.job.num = job
        job_dir = sweep_dir / str(job_config.hydra.sweep.subdir)  # the job's dir as Hydra names it
        sweep.record_failed_job(store, job_dir, f"job {job} failed: {how}", how)
    except Exception as err:  # noqa: BLE001 - the store's trouble must not end the sweep
        log.warning("job %s: its failure could not be recorded in MLflow: %s", job, err)


@contextlib.contextmanager
def output_to(path: Path):
    """This process's stdout and stderr (file descriptors 1 and 2, as its libraries write them) into `path`."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as sink:
        os.dup2(sink.fileno(), 1), os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


def ended_line(ended: Ended, metric: str | None) -> str:
    """The launcher's line for a job that ended: its number, GPUs, seconds and outcome."""
    ret = ended.ret
    if ended.exit_code is not None:
        outcome = f"stopped (exit {ended.exit_code})"
    elif ret is None or ret.status == JobStatus.FAILED or ended.failed:
        outcome = "failed (its console log says why)"
    elif isinstance(ret.return_value, float):
        outcome = f"{metric} {ret.return_value:.4f}"
    else:
        outcome = "finished"
    return (
        f"hydrali: job {ended.index} ended on GPUs {','.join(ended.gpus or ())} after {ended.seconds:.0f} s: {outcome}"
    )


def register() -> None:
    """hydra/launcher=hydrali (the default of -m) with Hydra's plugins: Hydra finds a launcher by scanning its
    hydra_plugins namespace, which misses the folder of an editable install (`pip install -e .`), so it is named."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.hydrali_launcher.hydrali_launcher import HydraliLauncher as Registered

    Plugins.instance().register(Registered)
