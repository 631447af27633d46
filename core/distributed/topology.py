"""Where this process sits in the job: world size, global, local and node rank, and its shards.

Read from the launcher's environment (torchrun, SLURM, Lightning's own DDP launcher, TensorFlow's
TF_CONFIG) and checked against what the backend was asked for (replicas per node x nodes). A DALI
shard is one replica. A process drives one replica (Lightning DDP, a Keras worker) or several (Keras
MirroredStrategy); process rank r with k replicas reads shards r*k .. r*k+k-1 of num_shards = world
size (all replicas of the job).

TF_CONFIG (Keras' MultiWorkerMirroredStrategy): every worker is a "node" of its own; the chief, when the
cluster names one, is rank 0 and the workers follow it ({"worker": [a, b]} -> ranks 0, 1;
{"chief": [a], "worker": [b, c]} -> chief 0, worker 0 -> 1, worker 1 -> 2).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from hydrali.core.distributed.launchers import (
    FRAMEWORK_RANKS,
    PLACEMENT,
    SLURM,
    STARTED_BY_A_LAUNCHER,
    TF_CONFIG,
    TORCHRUN,
    TORCHRUN_GROUP_RANK,
)
from hydrali.core.distributed.mpi_ranks import torchrun_variables
from hydrali.core.errors import HydraliError


@dataclass(frozen=True)
class Topology:
    """One process's place in the job. Ranks count processes; world_size counts replicas."""

    world_size: int
    global_rank: int
    local_rank: int
    node_rank: int
    replicas_per_node: int
    replicas_per_process: int = 1

    @property
    def shard_ids(self) -> tuple[int, ...]:
        """The DALI shards this process reads, one per replica it drives (by global, not local, rank)."""
        first = self.global_rank * self.replicas_per_process
        return tuple(range(first, first + self.replicas_per_process))

    @property
    def local_replicas(self) -> tuple[int, ...]:
        """The node-local index of each replica this process drives (its GPU when on GPUs)."""
        first = self.local_rank * self.replicas_per_process
        return tuple(range(first, first + self.replicas_per_process))

    @property
    def shard_id(self) -> int:
        """The first (for one-replica processes, the only) shard this process reads."""
        return self.shard_ids[0]

    @property
    def num_shards(self) -> int:
        """How many shards the dataset is split into: one per replica in the whole job."""
        return self.world_size

    @property
    def is_global_zero(self) -> bool:
        """Whether this process logs, tracks and writes the summary."""
        return self.global_rank == 0


def _env_int(env: dict, *names: str) -> int | None:
    for name in names:
        if env.get(name, "") != "":
            return int(env[name])
    return None


# Variables that give a rank to a process started by torchrun, SLURM or Lightning: they take precedence over TF_CONFIG
_TORCH_OR_SLURM_RANKS = (*FRAMEWORK_RANKS, TORCHRUN.local_rank)
TRAINING_TASKS = ("chief", "worker")  # TF_CONFIG task types that train (rank order: chief first)
EXAMPLE_TF_CONFIG = (
    """'{"cluster": {"worker": ["host1:12345", "host2:12345"]}, """
    """"task": {"type": "worker", "index": 0}}'"""
)


@dataclass(frozen=True)
class TFWorkers:
    """TensorFlow's multi-worker cluster as TF_CONFIG describes it: how many workers train, and this one's rank."""

    count: int
    rank: int


def tf_config_workers(env: dict | None = None) -> TFWorkers | None:
    """The training workers of TF_CONFIG (chief first, then the workers) and this process's rank among them;
    None without TF_CONFIG, or when torchrun's or SLURM's ranks are set (those are read instead)."""
    env = os.environ if env is None else env
    text = env.get(TF_CONFIG, "")
    if not text.strip() or any(env.get(name, "") != "" for name in _TORCH_OR_SLURM_RANKS):
        return None
    try:
        config = json.loads(text)
        cluster, task = config.get("cluster") or {}, config.get("task") or {}
        kind, index = str(task.get("type", "")), int(task.get("index", 0))
        sizes = {name: len(cluster.get(name) or ()) for name in TRAINING_TASKS}
    except (ValueError, TypeError, AttributeError) as err:
        raise HydraliError(
            f"TF_CONFIG is not TensorFlow's cluster JSON ({err}): export e.g. TF_CONFIG=" + EXAMPLE_TF_CONFIG
        ) from err
    if kind not in TRAINING_TASKS:
        raise HydraliError(
            f"TF_CONFIG's task type is {kind!r}: hydrali trains with MultiWorkerMirroredStrategy, "
            f"whose tasks are 'chief' or 'worker' (no 'ps' or 'evaluator')"
        )
    if sizes["chief"] > 1:
        raise HydraliError(f"TF_CONFIG names {sizes['chief']} chiefs: a cluster has at most one")
    if not 0 <= index < sizes[kind]:
        raise HydraliError(f"TF_CONFIG's task is {kind} {index} but its cluster lists {sizes[kind]} {kind}(s)")
    rank = index if kind == "chief" else sizes["chief"] + index
    return TFWorkers(count=sizes["chief"] + sizes["worker"], rank=rank)


def launched_externally(env: dict | None = None) -> bool:
    """Whether a launcher (torchrun, SLURM, Open MPI, a PMI launcher, or hydrali's own) started this process:
    then no framework or hydrali starts more."""
    env = os.environ if env is None else env
    return any(name in env for name in STARTED_BY_A_LAUNCHER)


def is_first_process(env: dict | None = None) -> bool:
    """Whether this is the job's first process (rank 0 on node 0), known before the backend is: the
    one that does job-wide work once, such as checking the dataset's files."""
    env = dict(os.environ if env is None else env)
    workers = tf_config_workers(env)
    if workers is not None:
        return workers.rank == 0
    return all((_env_int(env, name) or 0) == 0 for name in PLACEMENT)


def detect_topology(
    replicas_per_node: int, num_nodes: int, env: dict | None = None, replicas_per_process: int = 1
) -> Topology:
    """The topology of this process for a backend running `replicas_per_node` x `num_nodes` replicas,
    `replicas_per_process` of them in each process.

    Ranks come from torchrun (RANK, LOCAL_RANK, GROUP_RANK/NODE_RANK, WORLD_SIZE), SLURM
    (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS), Lightning's launcher
    (LOCAL_RANK, NODE_RANK) or TF_CONFIG (one worker per node: global and node rank = the worker's
    rank, chief first; local rank 0); a lone process is rank 0 of a one-node job.
    """
    env = dict(os.environ if env is None else env)
    if replicas_per_node < 1:
        raise HydraliError(f"the backend asks for {replicas_per_node} replicas per node; it needs at least 1")
    if num_nodes < 1:
        raise HydraliError(f"backend.num_nodes={num_nodes}: it needs at least 1")
    if replicas_per_node % replicas_per_process:
        raise HydraliError(
            f"{replicas_per_node} replicas per node cannot be split into processes of {replicas_per_process}"
        )
    processes_per_node = replicas_per_node // replicas_per_process
    expected_world = processes_per_node * num_nodes  # processes, checked against the launcher
    env.update(torchrun_variables(env))  # mpirun's or PMI's ranks; one error where they cannot be known

    local_rank = _env_int(env, TORCHRUN.local_rank, SLURM.local_rank) or 0
    node_rank = _env_int(env, TORCHRUN.node_rank, TORCHRUN_GROUP_RANK, SLURM.node_rank) or 0
    global_rank = _env_int(env, TORCHRUN.rank, SLURM.rank)
    if global_rank is None:
        global_rank = node_rank * processes_per_node + local_rank
    world = _env_int(env, TORCHRUN.world_size)
    if world is None and SLURM.world_size in env and SLURM.rank in env:
        world = _env_int(env, SLURM.world_size)
    workers = tf_config_workers(env)
    if workers is not None:
        global_rank, local_rank, node_rank, world = workers.rank, 0, workers.rank, workers.count
    if world is not None and world != expected_world:
        raise HydraliError(
            f"the launcher started {world} processes but the backend asks for {expected_world} "
            f"({processes_per_node} per node x {num_nodes} nodes): set backend.devices and "
            f"backend.num_nodes to match the launcher"
        )
    if not 0 <= global_rank < expected_world:
        raise HydraliError(f"global rank {global_rank} is outside a world of {expected_world} processes")
    return Topology(
        replicas_per_node * num_nodes, global_rank, local_rank, node_rank, replicas_per_node, replicas_per_process
    )
