"""Several Keras workers training one job: TensorFlow's MultiWorkerMirroredStrategy from TF_CONFIG, SLURM or hydrali.

Each worker is a process started by the user with its own TF_CONFIG (as torchrun starts Lightning's ranks),
one of the processes hydrali starts on one node with backend.processes=per_device (torchrun's variables and a port
each: core/distributed/local_launch.py; a worker per GPU, each taking the node's GPU of its local rank),
or a task of `srun` (TensorFlow's SlurmClusterResolver: workers meet on port 8888 + the task's index on its
node), and drives one replica: its GPU (SLURM: the node's GPU of its local task id), or its CPU. TF_CONFIG's
chief (or worker 0 without one), or SLURM's task 0, is global rank 0 (hydrali.core.distributed.topology): it alone
tracks, checkpoints and writes the run's files. The strategy is created once per process, before
TensorFlow runs any op (collectives are configured at its start); its all-reduce is the job's collective for
hydrali.core.distributed.gather (installed with the strategy): the workers share rank 0's start values (run dir,
drawn seed) and gather a validation's results through it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from hydrali.core.distributed import gather
from hydrali.core.distributed.device_count import devices_setting
from hydrali.core.distributed.launchers import (
    LAUNCHED_BY_HYDRALI,
    MASTER_ADDR,
    PROCESS_PORTS,
    SLURM,
    SLURM_NODES,
    SLURM_STEP_NODES,
    SLURM_STEP_TASKS,
    TORCHRUN,
)
from hydrali.core.distributed.topology import TFWorkers, tf_config_workers
from hydrali.core.errors import HydraliError

_strategy: tf.distribute.MultiWorkerMirroredStrategy | None = None


SLURM_PORT_BASE = 8888  # SlurmClusterResolver's: task i of a node listens on this port + i


def slurm_tasks(env=None) -> tuple[int, int] | None:
    """SLURM's tasks per node and nodes, when srun started several tasks (and no torchrun inside them)."""
    env = os.environ if env is None else env
    tasks = int(env.get(SLURM_STEP_TASKS) or env.get(SLURM.world_size) or 1)
    if env.get(SLURM.rank, "") == "" or env.get(TORCHRUN.rank, "") != "" or tasks < 2:
        return None
    nodes = int(env.get(SLURM_STEP_NODES) or env.get(SLURM_NODES) or 1)
    if tasks % nodes:
        raise HydraliError(
            f"srun started {tasks} tasks on {nodes} nodes: Keras workers need the same number of "
            f"tasks on every node (srun --ntasks-per-node=...)"
        )
    return tasks // nodes, nodes


def started_by_hydrali(env=None) -> list[str] | None:
    """The workers' addresses (host:port, in rank order) when hydrali started this job's processes on one node
    (backend.processes=per_device: core/distributed/local_launch.py gives each process a port); else None."""
    env = os.environ if env is None else env
    if env.get(LAUNCHED_BY_HYDRALI) != "1" or not env.get(PROCESS_PORTS) or env.get(TORCHRUN.rank, "") == "":
        return None
    return [f"{env[MASTER_ADDR]}:{port}" for port in env[PROCESS_PORTS].split(",")]


def cluster() -> TFWorkers | None:
    """This process's place among the job's workers (SLURM's tasks, the processes hydrali started, or TF_CONFIG's),
    when there are several."""
    slurm = slurm_tasks()
    if slurm is not None:
        return TFWorkers(count=slurm[0] * slurm[1], rank=int(os.environ[SLURM.rank]))
    started = started_by_hydrali()
    if started is not None and len(started) > 1:
        return TFWorkers(count=len(started), rank=int(os.environ[TORCHRUN.rank]))
    workers = tf_config_workers()
    return workers if workers is not None and workers.count > 1 else None


def local_workers() -> int | None:
    """The workers of this node that select their GPU by their local rank among every GPU of the node: SLURM's
    tasks of the node, or the processes hydrali started; None for TF_CONFIG's (each sees its own GPU)."""
    slurm = slurm_tasks()
    if slurm is not None:
        return slurm[0]
    started = started_by_hydrali()
    return len(started) if started is not None and len(started) > 1 else None


def _resolver():
    """SLURM's cluster as TensorFlow resolves it, or that of the processes hydrali started (None: TF_CONFIG's);
    hydrali places the GPUs itself."""
    slurm = slurm_tasks()
    if slurm is not None:
        return tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=SLURM_PORT_BASE, gpus_per_node=slurm[0], gpus_per_task=1, auto_set_gpu=False
        )
    started = started_by_hydrali()
    if started is None:
        return None
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": started}),
        task_type="worker",
        task_id=int(os.environ[TORCHRUN.rank]),
        rpc_layer="grpc",
    )


def strategy(device: str) -> tf.distribute.MultiWorkerMirroredStrategy:
    """The job's MultiWorkerMirroredStrategy (created on the first call, the same one after): collectives over
    NCCL between GPUs (`device` "gpu"), over gRPC rings between CPUs. Its all-reduce becomes, at every call, this
    process's collective for hydrali.core.distributed.gather."""
    global _strategy
    if _strategy is None:
        kind = tf.distribute.experimental.CommunicationImplementation
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=kind.NCCL if device == "gpu" else kind.RING
        )
        source = "SLURM's tasks" if slurm_tasks() else "hydrali's processes" if started_by_hydrali() else "TF_CONFIG"
        try:
            _strategy = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=_resolver(), communication_options=options
            )
        except (RuntimeError, ValueError, KeyError) as err:
            raise HydraliError(
                f"TensorFlow could not start MultiWorkerMirroredStrategy from {source} ({err}): start "
                f"every worker with the same cluster and its own task index"
            ) from err
    place = cluster()  # installed at every call: each run of the process starts with none (core.run.runner)
    gather.install(gather.all_gather_through_sum(_all_reduce_sum, place.rank, place.count))
    return _strategy


def select_gpu(local_rank: int) -> None:
    """Under SLURM or as a process hydrali started, with every GPU of the node visible, let TensorFlow see only this
    worker's (its local rank): its replica's "/gpu:0". Before TensorFlow's runtime starts."""
    gpus = tf.config.list_physical_devices("GPU")
    if local_workers() is not None and len(gpus) > 1:
        tf.config.set_visible_devices(gpus[local_rank], "GPU")


def one_replica_per_worker(devices, per_node: int, gpus: int) -> None:
    """Refuse what a worker cannot do: MultiWorkerMirroredStrategy reads one input pipeline per worker, so a
    worker drives one replica (one DALI shard), and backend.devices counts a node's workers (`per_node`)."""
    count = devices_setting(devices)
    if count is not None and count != per_node:
        raise HydraliError(
            f"backend.devices={count} with Keras workers, {per_node} per node: each worker drives one replica "
            f"(one GPU or its CPU); start one worker per GPU and set backend.devices to the workers per node "
            f"(or auto)"
        )
    if gpus > 1 and local_workers() is None:
        raise HydraliError(
            f"this TF_CONFIG worker sees {gpus} GPUs but drives one: start one worker per GPU, "
            f"each with CUDA_VISIBLE_DEVICES set to its own GPU"
        )


def share_from_rank0(values: dict, device: str) -> dict:
    """Rank 0's `values` (picklable) on every worker, gathered through the job's strategy (created if needed)."""
    if cluster() is None:
        return values
    strategy(device)
    return gather.gather_objects(values)[0]


_sum_step = None  # the all-reduce's tf.function, traced once per shape (not once per call) and kept by the process


def _all_reduce_sum(values: np.ndarray) -> np.ndarray:
    """The sum over the job's workers (one replica each) of every worker's `values` (int32, one shape on every
    worker), through the job's strategy (created before); every worker calls it at the same point."""
    global _sum_step
    if _sum_step is None:

        def step(tensor):
            local = tf.identity(tensor)  # on this replica's device
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)

        _sum_step = tf.function(step, reduce_retracing=True)
    job = _strategy
    result = job.run(_sum_step, args=(tf.constant(values, tf.int32),))
    return job.experimental_local_results(result)[0].numpy()


class ThrowawayCheckpoint(keras.callbacks.Callback):
    """A non-chief worker's side of the chief's per-epoch checkpoint: Keras reads some variables (metrics' sums)
    through collectives when it saves weights, so every worker saves, at the same point (the epochs `saves`
    names, as the chief's EpochCheckpoint); this one saves into a temporary dir and deletes it (as TensorFlow's
    multi-worker guide does)."""

    def __init__(self, saves: Callable[[int], bool]):
        super().__init__()
        self.saves = saves

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if not self.saves(epoch + 1):
            return
        scratch = tempfile.mkdtemp(prefix="hydrali_worker_")
        try:
            self.model.save_weights(os.path.join(scratch, "throwaway.weights.h5"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
