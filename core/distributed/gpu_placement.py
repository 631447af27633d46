"""Which GPUs each job of a parallel sweep trains on: the machine's GPUs cut into slots of a job's size, and a job's
process holding one slot for its whole life (conf/hydra/launcher/hydrali.yaml).

A slot is a lock file in the sweep dir (`.gpu-slots/slot-<i>.lock`), held with flock by the worker process that took
it: no two processes hold one, a worker that ends or dies frees its slot with its file descriptor (the operating
system releases the lock), and the next worker takes the free one. A worker's GPUs are fixed when it takes its slot
(CUDA reads CUDA_VISIBLE_DEVICES once, at its first call): the job's process, and every process it starts (its DDP
ranks), see only the slot's GPUs, as their GPUs 0..k-1, on every framework alike (torch, TensorFlow, DALI, NCCL).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from hydrali.core.errors import HydraliError

log = logging.getLogger("hydrali")

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
SLOTS_VARIABLE = "HYDRALI_GPU_SLOTS"  # set by the launcher for its workers: {"dir": ..., "slots": [[ids], ...]}
SLOTS_DIR = ".gpu-slots"  # in the sweep dir
RUNNING_PREFIX = "running-"  # in SLOTS_DIR: a job a worker runs now (its number), removed when it ends
STOP_FILE = "stop"  # in SLOTS_DIR: the sweep is stopping (Ctrl+C, SIGTERM): a worker starts no further job
WAIT_SECONDS = 0.2  # between tries while every slot is held (a replaced worker waits for its predecessor's exit)
AUTO = "auto"


@dataclass(frozen=True)
class Placement:
    """The GPU slots of a sweep: each a tuple of GPU ids (as CUDA_VISIBLE_DEVICES names them), disjoint."""

    slots: tuple[tuple[str, ...], ...]

    @property
    def parallel(self) -> bool:
        """Whether jobs run at once: two slots or more."""
        return len(self.slots) >= 2

    def describe(self) -> str:
        """The slots in words, e.g. `2 jobs at once, on GPUs 0,1 | 2,3`."""
        return f"{len(self.slots)} jobs at once, on GPUs " + " | ".join(",".join(s) for s in self.slots)


def count_gpus() -> int:
    """The GPUs of this machine, as DALI counts them (0 without a driver)."""
    from hydrali.core.data.devices import dali_cuda_devices

    return dali_cuda_devices()[0]


def visible_gpus(gpus, count_gpus) -> list[str]:
    """The GPU ids a sweep may use: `gpus` (a list of ids, or auto: those of CUDA_VISIBLE_DEVICES when it is set,
    else 0..n-1 for the `count_gpus()` GPUs of the machine)."""
    if str(gpus).lower() != AUTO:
        if isinstance(gpus, (int, str)):
            gpus = [gpus]
        ids = [str(g).strip() for g in gpus]
        if not ids or any(not i for i in ids) or len(set(ids)) != len(ids):
            raise HydraliError(f"hydra.launcher.gpus={list(gpus)}: give distinct GPU ids, e.g. [0,1], or auto")
        return ids
    named = os.environ.get(CUDA_VISIBLE_DEVICES)
    if named is not None:
        return [i.strip() for i in named.split(",") if i.strip() and i.strip() != "-1"]
    return [str(i) for i in range(count_gpus())]


def plan(gpus: list[str], per_job: int) -> Placement:
    """The slots of `per_job` GPUs each that `gpus` hold (the GPUs left over stay idle); one slot of every GPU
    (nothing to split) where they hold fewer than two."""
    if per_job < 1:
        raise HydraliError(f"hydra.launcher.gpus_per_job={per_job}: give a number of GPUs, at least 1")
    count = len(gpus) // per_job
    if count < 2:
        return Placement((tuple(gpus),))
    return Placement(tuple(tuple(gpus[i * per_job : (i + 1) * per_job]) for i in range(count)))


def offer(placement: Placement, sweep_dir: Path) -> dict[str, str]:
    """The environment that tells a sweep's worker processes the slots they take theirs from (lock files made)."""
    folder = Path(sweep_dir) / SLOTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STOP_FILE).unlink(missing_ok=True)  # a sweep started again in its dir
    for mark in folder.glob(f"{RUNNING_PREFIX}*"):  # of a launcher that ended before its jobs
        mark.unlink(missing_ok=True)
    for index in range(len(placement.slots)):
        (folder / f"slot-{index}.lock").touch()
    return {SLOTS_VARIABLE: json.dumps({"dir": str(folder), "slots": [list(s) for s in placement.slots]})}


_held: dict = {}  # this process's slot: {"index", "gpus", "file"} (the open file keeps the lock)


def take() -> tuple[str, ...] | None:
    """In a worker of a parallel sweep: the GPUs of the slot this process holds, taking a free one first (waiting
    while every slot is held) and making them the only ones its CUDA libraries see; None outside such a sweep."""
    offered = os.environ.get(SLOTS_VARIABLE)
    if not offered:
        return None
    if _held:
        return _held["gpus"]
    spec = json.loads(offered)
    folder, slots = Path(spec["dir"]), [tuple(s) for s in spec["slots"]]
    while True:
        for index, gpus in enumerate(slots):
            handle = open(folder / f"slot-{index}.lock", "a")  # noqa: SIM115 - held open: the lock is the file's
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            handle.truncate(0)
            handle.write(str(os.getpid()))  # who holds it: the launcher passes a stop on to its holders
            handle.flush()
            _held.update(index=index, gpus=gpus, file=handle)
            os.environ[CUDA_VISIBLE_DEVICES] = ",".join(gpus)
            _keep_to_cpu_share(index, len(slots))
            return gpus
        time.sleep(WAIT_SECONDS)


def _keep_to_cpu_share(index: int, count: int) -> None:
    """Bind this worker to the `index`-th of `count` contiguous parts of its cores, so that the jobs at once do not
    pin their DALI threads to the same cores (hydrali.core.data.affinity takes a process's binding as its share)."""
    cores = sorted(os.sched_getaffinity(0))
    per_slot = len(cores) // count
    if per_slot >= 1:
        os.sched_setaffinity(0, cores[index * per_slot : (index + 1) * per_slot])


def held() -> tuple[str, ...] | None:
    """The GPUs of the slot this process holds (None when it holds none)."""
    return _held.get("gpus")


def holders(sweep_dir: Path) -> list[int]:
    """The process ids of the workers holding the slots of the sweep in `sweep_dir` now."""
    pids = []
    for path in sorted((Path(sweep_dir) / SLOTS_DIR).glob("slot-*.lock")):
        with open(path, "a+") as handle:
            try:  # a slot no one holds is free to lock: its pid, if any, is of a worker that ended
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
                continue
            except BlockingIOError:
                pass
            handle.seek(0)
            text = handle.read().strip()
        if text.isdigit():
            pids.append(int(text))
    return pids


def ask_to_stop(sweep_dir: Path) -> None:
    """Mark the sweep in `sweep_dir` as stopping: its workers start no further job."""
    (Path(sweep_dir) / SLOTS_DIR / STOP_FILE).touch()


def stopping() -> bool:
    """In a worker of a parallel sweep: whether the sweep is stopping."""
    offered = os.environ.get(SLOTS_VARIABLE)
    return bool(offered) and (Path(json.loads(offered)["dir"]) / STOP_FILE).exists()


@contextmanager
def running(job: int) -> Iterator[None]:
    """In a worker of a parallel sweep: mark job `job` as running in it while the body runs (a worker that dies
    leaves its mark, which names the jobs it took with it)."""
    offered = os.environ.get(SLOTS_VARIABLE)
    if not offered:
        yield
        return
    mark = Path(json.loads(offered)["dir"]) / f"{RUNNING_PREFIX}{job}"
    mark.touch()
    try:
        yield
    finally:
        mark.unlink(missing_ok=True)


def left_running(sweep_dir: Path) -> list[int]:
    """The jobs marked running in the sweep in `sweep_dir` whose workers ended without ending them (their marks
    taken away)."""
    jobs = []
    for mark in (Path(sweep_dir) / SLOTS_DIR).glob(f"{RUNNING_PREFIX}*"):
        jobs.append(int(mark.name[len(RUNNING_PREFIX) :]))
        mark.unlink(missing_ok=True)
    return sorted(jobs)
