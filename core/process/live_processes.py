"""A job's processes never outlive the process that started them, and hold its run dir while they live.

The process that runs a job (the launcher) starts one process per replica on its node
(core/distributed/local_launch.py). Killed with a signal it cannot catch (a scheduler's SIGKILL, the OOM killer), it
would leave them training as orphans, writing the run dir beside the next attempt. Two guards, both kept by the
kernel (Linux), whatever way the launcher ends:

- each process asks for SIGKILL when its launcher ends (the parent-death signal, prctl PR_SET_PDEATHSIG), first
  thing at its start, then checks that its parent is still the launcher: one that ended before the request is seen
  too. Their own threads (DALI's) end with them; a framework's worker processes watch their own parent;
- each process inherits the launcher's descriptor of the run dir that holds the dir's lock (core/run/run_dir.py:
  flock on the dir). The lock belongs to that open file, shared by every process holding it, so the kernel releases
  it only when the last of them ends: while any process of the job lives, a new attempt in the dir is refused as in
  use, and once all have ended the dir resumes as after any interruption.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from hydrali.core.distributed.launchers import LAUNCHER_PID

log = logging.getLogger("hydrali")

_PR_SET_PDEATHSIG = 1  # prctl's option number (linux/prctl.h)
# A job's process ends at once when its launcher has: its peers and the launcher are gone, so a clean stop (a
# checkpoint the processes agree on) is out of reach; the run resumes from its newest checkpoint, as after any kill
_ON_LAUNCHER_DEATH = signal.SIGKILL
_held: dict[Path, int] = {}  # run dir -> the descriptor of it that holds its lock in this process (`holding`)


@contextlib.contextmanager
def holding(output_dir: str | os.PathLike, descriptor: int) -> Iterator[None]:
    """Note, while the block runs, that `descriptor` (of `output_dir`) holds the run dir's lock in this process: the
    processes `start` starts for the run inherit it."""
    key = Path(output_dir).resolve()
    _held[key] = descriptor
    try:
        yield
    finally:
        if _held.get(key) == descriptor:
            del _held[key]


def lock_of(output_dir: str | os.PathLike) -> int | None:
    """The descriptor holding `output_dir`'s lock in this process, or None when this process does not hold it."""
    return _held.get(Path(output_dir).resolve())


def start(command: Sequence[str], env: Mapping[str, str], output_dir: str | os.PathLike) -> subprocess.Popen:
    """Start `command` with `env` as one of the processes of the run in `output_dir`: it holds the run dir's lock
    with this process (when this one holds it) and, once it calls `stop_with_launcher`, ends when this one does.
    Call it from the thread that waits for the processes: the kernel's signal comes when that thread ends."""
    lock = lock_of(output_dir)
    return subprocess.Popen(
        list(command),
        env={**env, LAUNCHER_PID: str(os.getpid())},
        pass_fds=() if lock is None else (lock,),
    )


def stop_with_launcher() -> None:
    """In a process that `start` started: end (SIGKILL) when the process that started it ends, from now on or
    already. Nothing in any other process."""
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(_ON_LAUNCHER_DEATH), 0, 0, 0) != 0:
        log.warning(
            "this process cannot ask to end with the process that started it (prctl: %s): it may outlive it",
            os.strerror(ctypes.get_errno()),
        )
    if os.getppid() != int(launcher):  # it ended before the request: no signal will come
        os.kill(os.getpid(), _ON_LAUNCHER_DEATH)
