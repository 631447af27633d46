"""A job's processes on this node, started from the job's resolved config.

Lightning's own launcher starts DDP processes by re-running the command line: under `-m` every process would
start a sweep of its own (Lightning issue 11300), and every process resolves `${now:...}` and `seed=null` for
itself. hydrali starts them instead, as NeMo's hydra_runner and hydra-zen's HydraDDP do: the job's process
resolves the config once (run dir, seed, every interpolation), saves it in the run dir and starts one
process per replica that reads it, with the ranks in torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), so that the framework takes them as launched from outside. One output dir and one
MLflow run per job, whatever the number of processes. The processes end with the job's process, however it ends,
and hold its run dir while they live (core/process/live_processes.py).

    python -m hydrali.core.cli.launched <run dir>/.launch      # what each process runs
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

from omegaconf import DictConfig, OmegaConf

from hydrali.core.distributed import topology
from hydrali.core.distributed.launchers import (
    LAUNCHED_BY_HYDRALI,
    MASTER_ADDR,
    MASTER_PORT,
    PROCESS_PORTS,
    TORCHRUN,
    TORCHRUN_GROUP_RANK,
)
from hydrali.core.errors import HydraliError, SweepRefused
from hydrali.core.process import job_context, live_processes
from hydrali.core.process.preemption import Preempted, PreemptionWatch

log = logging.getLogger("hydrali")

LOOPBACK = "127.0.0.1"  # one node: the processes meet here
LAUNCH_DIR = ".launch"  # in the run dir: the resolved config the processes read, and each rank's error
CONFIG_FILE, CONTEXT_FILE, LOGGING_FILE = "config.yaml", "job.json", "logging.json"
BAD_FILES_FILE = "bad_files.json"  # the image files the job's process found bad: the processes check none again
_POLL_S = 0.2  # how often the job's process looks at its processes
_GRACE_S = 30  # how long the other processes get to end after one failed


def check_sweep_launch(backend: str, replicas_per_node: int, replicas_started: int, hint: str) -> None:
    """Under -m, refuse (SweepRefused, one line) a job whose `replicas_per_node` neither hydrali
    (`replicas_started`: the replicas of the processes hydrali starts) nor an outside launcher (torchrun, srun, MPI)
    starts: the framework's own launcher would re-run the command line, the whole sweep, in every process.
    `hint`: the backend's settings that let hydrali start them (its spec's sweep_launch_hint)."""
    if not job_context.current().in_sweep or topology.launched_externally() or replicas_per_node <= replicas_started:
        return
    raise SweepRefused(
        f"-m with backend={backend} and {replicas_per_node} processes per node that its framework's own launcher "
        f"would start is not supported: it would restart the whole sweep in every process. {hint}start them with "
        f"torchrun or srun"
    )


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports free on the loopback now (each held until all are found)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in socks]


def save_launch(cfg: DictConfig, seed: int, overrides: list[str], bad_files: Iterable[tuple[Path, str]] = ()) -> Path:
    """Write the job's resolved config (with the seed drawn once), its context (sweep, and the `overrides` its
    config is composed from), its logging config and the image files its check found bad (data.bad_files=skip)
    into <run dir>/.launch, for the processes to read."""
    from hydra.core.hydra_config import HydraConfig

    folder = Path(cfg.paths.output_dir) / LAUNCH_DIR
    folder.mkdir(parents=True, exist_ok=True)
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    resolved.seed = seed
    OmegaConf.save(resolved, folder / CONFIG_FILE)
    context = {**job_context.current().to_dict(), "overrides": list(overrides)}
    (folder / CONTEXT_FILE).write_text(json.dumps(context) + "\n")
    (folder / BAD_FILES_FILE).write_text(json.dumps([[str(path), why] for path, why in bad_files]) + "\n")
    if HydraConfig.initialized():
        logging_cfg = OmegaConf.to_container(HydraConfig.get().job_logging, resolve=True)
        (folder / LOGGING_FILE).write_text(json.dumps(logging_cfg) + "\n")
    return folder


def checked_by_job(output_dir: Path) -> list[tuple[Path, str]] | None:
    """In a process hydrali started: the image files the job's process found bad (its check of the data), or None
    when it left no such list."""
    path = Path(output_dir) / LAUNCH_DIR / BAD_FILES_FILE
    if not path.is_file():
        return None
    return [(Path(name), why) for name, why in json.loads(path.read_text())]


def run_processes(
    cfg: DictConfig,
    processes: int,
    num_nodes: int,
    seed: int,
    overrides: list[str],
    preemption: PreemptionWatch | None = None,
    bad_files: Iterable[tuple[Path, str]] = (),
) -> Path:
    """Start `processes` processes of this job on this node from its resolved config (composed from `overrides`),
    wait for them, and return the run dir. The image files the job's process found bad (`bad_files`) are the
    processes' own check: each leaves out the same files, none reads them again. A process that fails ends the
    others; its one-line message is raised. A signal `preemption` watches is passed on to the processes; when they
    stop on it (after their checkpoint), Preempted is raised here too.

    Several nodes (each started by hand, as with Lightning's launcher): NODE_RANK, MASTER_ADDR and MASTER_PORT
    come from the environment; one node: node 0 on 127.0.0.1 and a free port."""
    node_rank = int(os.environ.get(TORCHRUN.node_rank, "0"))
    if num_nodes > 1 and not all(os.environ.get(k) for k in (TORCHRUN.node_rank, MASTER_ADDR, MASTER_PORT)):
        raise HydraliError(
            f"backend.num_nodes={num_nodes} without a launcher: set NODE_RANK, MASTER_ADDR and "
            f"MASTER_PORT on every node, or start the processes with torchrun or srun"
        )
    address = os.environ.get(MASTER_ADDR, LOOPBACK) if num_nodes > 1 else LOOPBACK
    if num_nodes > 1:
        port, ports = os.environ.get(MASTER_PORT, ""), {}
    else:  # one node: torch's rendezvous port and a port per process (TensorFlow's workers), distinct at once
        free = _free_ports(processes + 1)
        port, ports = str(free[0]), {PROCESS_PORTS: ",".join(map(str, free[1:]))}
    folder = save_launch(cfg, seed, overrides, bad_files)
    log.info(
        "starting %d process(es) on node %d from the resolved config %s (seed %d)",
        processes,
        node_rank,
        folder / CONFIG_FILE,
        seed,
    )
    procs = []
    for local in range(processes):
        rank = node_rank * processes + local
        env = {
            **os.environ,
            TORCHRUN.rank: str(rank),
            TORCHRUN.local_rank: str(local),
            TORCHRUN.node_rank: str(node_rank),
            TORCHRUN_GROUP_RANK: str(node_rank),
            TORCHRUN.world_size: str(processes * num_nodes),
            TORCHRUN.local_world_size: str(processes),
            MASTER_ADDR: address,
            MASTER_PORT: port,
            **ports,
            LAUNCHED_BY_HYDRALI: "1",
        }
        # each ends with this process and holds the run dir with it (core/process/live_processes.py)
        command = [sys.executable, "-m", "hydrali.core.cli.launched", str(folder)]
        procs.append(live_processes.start(command, env, cfg.paths.output_dir))
    if preemption is not None:
        preemption.relay = lambda signum: _send(procs, signum)
    try:
        failed = _wait(procs)
    except KeyboardInterrupt:  # a Ctrl+C reaches the processes too: let them end their run (KILLED) first
        _end(procs, signal.SIGINT, wait_first=True)
        raise
    if failed is not None:
        local, code = failed
        stopped_by = preemption.stopped_by(code) if preemption is not None else None
        _end(procs, signal.SIGINT, wait_first=stopped_by is not None)  # as Ctrl+C: each ends its run cleanly
        if code == 130:
            raise KeyboardInterrupt
        if stopped_by is not None:  # every process stops at the same step, after the checkpoint
            raise Preempted(stopped_by, f"the job's {processes * num_nodes} processes saved a checkpoint and stopped")
        rank = node_rank * processes + local  # the global rank its error file is named by (core/cli/launched.py)
        error = folder / f"rank{rank}.error"
        message = error.read_text().strip() if error.exists() else f"it ended with exit code {code} (its log is above)"
        raise HydraliError(f"process {rank} of {processes * num_nodes} failed: {message}")
    return Path(cfg.paths.output_dir)


def _wait(procs: list[subprocess.Popen]) -> tuple[int, int] | None:
    """Wait for every process; (its index on this node, exit code) of the first that failed, or None."""
    while True:
        codes = [proc.poll() for proc in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                return rank, code
        if all(code == 0 for code in codes):
            return None
        time.sleep(_POLL_S)


def _send(procs: list[subprocess.Popen], sig: int) -> None:
    """Send `sig` to the processes still running."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)


def _end(procs: list[subprocess.Popen], sig: int, wait_first: bool = False) -> None:
    """End the processes still running: `sig` (after a grace period if `wait_first`), then a kill."""
    if wait_first:
        deadline = time.monotonic() + _GRACE_S
        while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    deadline = time.monotonic() + _GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
