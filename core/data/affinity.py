"""`pipeline.worker_cores`: the CPU cores DALI's worker threads of this process may run on.

On a GPU the training process's main thread launches the kernels that keep the GPU busy; when DALI's CPU workers
(file reading, JPEG headers, crops) run on its core, the launches wait. With `spare`, the worker threads of this
process's pipelines are pinned (DALI's `set_affinity`, one core per thread from `DALI_AFFINITY_MASK`) to its share
of the node's cores but the first, which is kept for the main thread. `auto` is `spare` for GPU pipelines of a
process that drives one replica, and `any` (the OS places them, DALI's default) otherwise: on a CPU the training
itself wants every core, and the pipelines of several replicas in one process (Keras on several GPUs) would put
their first threads on the same core.

`cpu_threads`: the training framework's compute threads. On a CPU, torch's intra-op (OpenMP) pool and TensorFlow's
take a thread per core by default, and DALI's worker threads want cores too: with both, the cores are oversubscribed
and every step waits (measured on 2 cores with a second process busy: a Lightning epoch of the bundled digits took
32.8 s, and 12.7 s with one OpenMP thread). `auto` gives the framework this process's cores less its DALI training
pipelines' worker threads, at least one; a backend applies it (Backend.use_cpu_threads) before it trains.

DALI reads the mask when a pipeline starts its threads, so it is set for the process before any pipeline is built
(the runner calls `pin_workers` before the autotune probe and the backend), and every pipeline built after it
(core.data.pipelines.make_pipeline asks `dali_arguments`) is pinned alike.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hydrali.core.config.schema import WorkerCores

log = logging.getLogger("hydrali")

MASK_VARIABLE = "DALI_AFFINITY_MASK"  # DALI's: comma-separated cores, thread i of a pipeline on entry i
WORKER_THREAD_PREFIX = "[DALI][TP"  # how DALI names its worker threads (the thread pool's)

_pinned: list[int] | None = None  # the worker cores this process's pipelines are pinned to (None: not pinned)


def process_share(cores: list[int], machine_cores: int, local_rank: int, processes_on_node: int) -> list[int]:
    """The cores of this process: those a launcher bound it to (its affinity smaller than the machine), else its
    local rank's contiguous part of the machine's cores split between the node's processes."""
    cores = sorted(cores)
    if len(cores) < machine_cores or processes_on_node <= 1:
        return cores
    per_process = max(1, len(cores) // processes_on_node)
    start = min(local_rank * per_process, len(cores) - per_process)
    return cores[start : start + per_process]


def worker_cores(share: list[int]) -> list[int] | None:
    """The cores DALI's workers may use: the share but its first core (the main thread's); None when the share
    has one core, which cannot be split."""
    return list(share[1:]) if len(share) > 1 else None


def decide(setting: str, device: str, replicas_in_process: int) -> WorkerCores:
    """`auto` resolved: spare for GPU pipelines of a one-replica process, else any; spare or any as given."""
    chosen = WorkerCores.of(setting, "pipeline.worker_cores")
    if chosen is WorkerCores.auto:
        return WorkerCores.spare if device == "gpu" and replicas_in_process == 1 else WorkerCores.any
    return chosen


THREAD_VARIABLES = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")  # a caller's choice of the frameworks' threads
AUTO = "auto"


def framework_threads(
    setting, device: str, pipeline_threads: int, replicas_in_process: int, cores: int, env=os.environ
) -> int | None:
    """The intra-op threads the training framework of this process gets (`cpu_threads`): a number as given; `auto`
    where DALI runs on the CPU (`device`: DALI's, whose workers then want the cores whichever device trains), its
    `cores` less `pipeline_threads` DALI workers per replica it drives, at least 1; None (the framework's default)
    for `auto` where DALI runs on a GPU or where the caller set one of THREAD_VARIABLES."""
    if str(setting) != AUTO:
        return int(setting)
    if device != "cpu" or any(variable in env for variable in THREAD_VARIABLES):
        return None
    return max(1, cores - pipeline_threads * max(1, replicas_in_process))


def pin_workers(pipeline, plan, processes_on_node: int) -> list[int] | None:
    """Decide pipeline.worker_cores for this process (`plan`: its local rank, replicas and DALI's device), set
    DALI's mask for the pipelines it builds from now on, log what was decided, and return the workers' cores
    (None: left to the OS)."""
    global _pinned
    _pinned = None
    os.environ.pop(MASK_VARIABLE, None)  # an earlier job of this process (a sweep) may have set it
    if decide(pipeline.worker_cores, plan.device, len(plan.shards)) is WorkerCores.any:
        return None
    share = process_share(
        list(os.sched_getaffinity(0)), os.cpu_count() or 1, plan.local_rank, max(1, processes_on_node)
    )
    cores = worker_cores(share)
    if cores is None:
        log.info("pipeline.worker_cores: this process has one core (%d): DALI's threads share it", share[0])
        return None
    entries = max(os.cpu_count() or 1, int(pipeline.num_threads))  # one per thread a pipeline may start
    os.environ[MASK_VARIABLE] = ",".join(str(cores[i % len(cores)]) for i in range(entries))
    _pinned = cores
    log.info(
        "pipeline.worker_cores: DALI's worker threads on cores %s, core %d kept for the main thread",
        _ranges(cores),
        share[0],
    )
    return cores


def dali_arguments() -> dict:
    """The Pipeline arguments that pin its worker threads as decided by pin_workers (none when not pinned)."""
    return {"set_affinity": True} if _pinned is not None else {}


def worker_thread_cores(pid: str = "self") -> dict[str, set[int]]:
    """What the OS lets each DALI worker thread of a process run on: {thread id: cores}, read from /proc."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(WORKER_THREAD_PREFIX):
            allowed = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
            found[task.name] = _parse_ranges(allowed.split(":", 1)[1].strip())
    return found


def _parse_ranges(text: str) -> set[int]:
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def _ranges(cores: list[int]) -> str:
    """Cores as Linux writes them: 1-7,9."""
    parts, start = [], None
    for i, core in enumerate(cores):
        if start is None:
            start = core
        if i + 1 == len(cores) or cores[i + 1] != core + 1:
            parts.append(str(start) if start == core else f"{start}-{core}")
            start = None
    return ",".join(parts)
