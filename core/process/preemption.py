"""Preemption: a signal that asks a run to stop soon (SLURM's `--signal` before a preemption or the time limit,
submitit's USR2) becomes a checkpoint at the next training step, then a hand-over to whoever requeues the job.

The signal handler only notes the signal: the backend asks `requested()` after each training step (all processes
of a job agree on it, core/contracts/backend.py), saves a checkpoint where the epoch is, and raises `Preempted`.
The run is marked KILLED in MLflow, and `hand_over()` then requeues the job: through the handler that was there
before hydrali's (submitit's, which requeues the job and exits), or with `scontrol requeue` on a plain SLURM job.
Started again in its run dir with the same settings, the run resumes from that checkpoint (core/run/runner.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from contextlib import contextmanager
from typing import Iterator

from hydrali.core.errors import HydraliError

log = logging.getLogger("hydrali")
EXIT_SIGNAL_BASE = 128  # a process stopped on signal N after its checkpoint exits with 128 + N (as shells report it)
# the signals a scheduler sends before it stops a job (SIGINT stays Ctrl+C: the run stops at once, marked KILLED)
SAVE_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGHUP", "SIGXCPU", "SIGCONT")


class Preempted(BaseException):
    """The run stopped on a preemption signal after saving a checkpoint. Not an Exception: a sweep's job runner
    (hydrali.core.tracking.sweep.run_job) must not record it as a failure, and Lightning re-raises it."""

    def __init__(self, signum: int, what: str):
        super().__init__(f"{signal.Signals(signum).name}: {what}")
        self.signum = signum


def signal_number(name: str) -> int:
    """The number of signal `name` (SIGUSR1 or USR1); a HydraliError naming the setting when it is not one hydrali
    can wait for."""
    full = (name if name.upper().startswith("SIG") else f"SIG{name}").upper()
    if full not in SAVE_SIGNALS:
        raise HydraliError(
            f"preemption.signals: {name} is not a signal a run can save on: pass some of {', '.join(SAVE_SIGNALS)}"
        )
    return int(getattr(signal, full))


class CheckCadence:
    """After which training batches the job's processes agree on a preemption signal, counted in optimizer steps:
    after every optimizer step for one process, after every `every_n`-th optimizer step of the attempt for several
    (agreeing is a collective), counted on across epochs whatever their length and the gradient accumulation. Never
    in the middle of an accumulation, nor after an epoch's last batch: a check due there is the epoch's end, where
    the run stops before the next epoch (so a signal waits at most `every_n` optimizer steps and a validation)."""

    def __init__(self, every_n: int, processes: int):
        self.every_n, self.processes = max(1, int(every_n)), int(processes)
        self.optimizer_steps = 0  # of this attempt, over its epochs

    def after_batch(self, batch_idx: int, batches_in_epoch: int, accumulate: int) -> bool:
        """Whether the processes agree after batch `batch_idx` (from 0) of an epoch of `batches_in_epoch`, with
        gradients accumulated over `accumulate` batches (the epoch's last batch ends an accumulation)."""
        last = batch_idx + 1 >= batches_in_epoch
        if (batch_idx + 1) % max(1, int(accumulate)) and not last:
            return False  # in the middle of an accumulation: no optimizer step yet
        self.optimizer_steps += 1
        if last:
            return False
        return self.processes == 1 or self.optimizer_steps % self.every_n == 0


class PreemptionWatch:
    """Notes the first of `signals` this process receives, while installed; hands the job over afterwards."""

    def __init__(self, signals: list[str], check_every_n_steps: int, requeue: bool):
        self.signals = [signal_number(name) for name in signals]
        self.check_every_n_steps = max(1, int(check_every_n_steps))
        self.requeue = bool(requeue)
        self.received: int | None = None
        self.relay = None  # relay(signum): passes the signal on (to the processes this one started for the job)
        self._previous: dict[int, object] = {}

    def _note(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
        if self.relay is not None:
            self.relay(signum)

    def install(self) -> None:
        """Note the signals from now on (the handlers they had are kept for the hand-over and restored)."""
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._note)

    def reassert(self) -> None:
        """Take the signals back: a library may install its own handler in C once loaded (on a GPU machine, one
        that the CUDA-side libraries load takes SIGUSR1 and SIGUSR2, and the signal never reaches Python). The
        backends call this when training starts and at each epoch's start."""
        for signum in self._previous:
            signal.signal(signum, self._note)

    def restore(self) -> None:
        """Give the signals their handlers from before `install`."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def stopped_by(self, exit_code: int) -> int | None:
        """The signal of the watched ones that a process's `exit_code` says it stopped on: 128 + it after the process
        saved and stopped, or minus it when the signal ended the process before it watched (None: neither)."""
        signum = -exit_code if exit_code < 0 else exit_code - EXIT_SIGNAL_BASE
        return signum if signum in self.signals else None

    def requested(self) -> bool:
        """Whether this process received one of the signals."""
        return self.received is not None

    def cadence(self, processes: int) -> CheckCadence:
        """The steps after which this run's `processes` agree on a signal (a new count for each attempt)."""
        return CheckCadence(self.check_every_n_steps, processes)

    def hand_over(self, stop: Preempted, first_process: bool) -> None:
        """After the checkpoint: call the handler the signal had before hydrali's (submitit's requeues the job and
        exits), else, on the job's first process of a SLURM job with preemption.requeue, requeue it with scontrol."""
        signum = stop.signum
        previous = self._previous.get(signum)
        if callable(previous):  # it may end the process: the log says why first
            log.warning("preempted by %s; handing the job over to the signal's handler before hydrali's", stop)
            previous(signum, None)
            return
        job = os.environ.get("SLURM_JOB_ID")
        if not (self.requeue and job and first_process):
            return
        scontrol = shutil.which("scontrol")
        if scontrol is None:
            log.warning("SLURM job %s not requeued: scontrol is not on PATH", job)
            return
        done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            log.info("SLURM job %s requeued: it resumes from the checkpoint when it starts again", job)
        else:
            log.warning("scontrol requeue %s failed: %s", job, (done.stderr or done.stdout).strip())


@contextmanager
def watching(preemption) -> Iterator[PreemptionWatch]:
    """A PreemptionWatch of the `preemption` config node, installed for the block."""
    watch = PreemptionWatch(list(preemption.signals), preemption.check_every_n_steps, preemption.requeue)
    watch.install()
    try:
        yield watch
    finally:
        watch.restore()
