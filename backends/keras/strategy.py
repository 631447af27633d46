"""The devices Keras trains on and the tf.distribute strategy over them.

GPUs: MirroredStrategy over the first `replicas` visible GPUs. CPU: the CPU is split into
`replicas` logical devices, so that N replicas really run (and really all-reduce) on one CPU.
One replica: TensorFlow's default strategy. Several TF_CONFIG workers: MultiWorkerMirroredStrategy
(hydrali.backends.keras.workers), one replica per worker, the worker's rank offsetting its shard
(hydrali.core.distributed.topology).
"""

from __future__ import annotations

import contextlib
import logging

import tensorflow as tf

from hydrali.backends.keras import workers
from hydrali.core.contracts.backend import TrainingDevice
from hydrali.core.errors import HydraliError
from hydrali.core.run.plan import Plan

log = logging.getLogger("hydrali")


def visible_gpus() -> int:
    """The number of GPUs TensorFlow can see."""
    return len(tf.config.list_physical_devices("GPU"))


def training_device() -> TrainingDevice:
    """The first GPU TensorFlow sees, with its name and compute capability (read without starting the runtime),
    or the CPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return TrainingDevice("cpu", "CPU")
    details = tf.config.experimental.get_device_details(gpus[0])
    capability = details.get("compute_capability")
    return TrainingDevice("gpu", details.get("device_name", gpus[0].name), tuple(capability) if capability else None)


def configure_devices(replicas: int, device: str) -> list[str]:
    """Make `replicas` devices of kind `device` ("cpu" or "gpu") available; return their names.

    On the CPU this must run before TensorFlow starts its runtime: logical devices cannot be
    added later. A runtime already split into at least `replicas` CPUs is accepted as it is.
    """
    if device == "gpu":
        for gpu in tf.config.list_physical_devices("GPU"):
            try:  # take GPU memory as needed: DALI allocates on the same GPUs
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError:  # the runtime already started; its setting stands
                pass
        return [f"/gpu:{i}" for i in range(replicas)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        if replicas > 1:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    except RuntimeError as err:  # the runtime was already started (e.g. an earlier run in this process)
        if len(tf.config.list_logical_devices("CPU")) < replicas:
            raise HydraliError(
                f"backend.replicas={replicas} needs {replicas} logical CPUs but TensorFlow already "
                f"started with fewer in this process: run hydrali in a new process"
            ) from err
    return [f"/cpu:{i}" for i in range(replicas)]


def replica_devices(plan: Plan) -> list[str]:
    """The devices of this process's replicas, made available: its GPUs when TensorFlow sees any (a SLURM task
    first picks its own), else logical CPUs; one per shard of the plan."""
    workers.select_gpu(plan.local_rank)
    return configure_devices(len(plan.shards), "gpu" if visible_gpus() else "cpu")


def make_strategy(devices: list[str]) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy for TF_CONFIG workers, MirroredStrategy over `devices`, or the default strategy
    for a single replica."""
    if workers.cluster() is not None:
        return workers.strategy("gpu" if devices[0].startswith("/gpu") else "cpu")
    if len(devices) == 1:
        return tf.distribute.get_strategy()
    cross_device_ops = None if devices[0].startswith("/gpu") else tf.distribute.ReductionToOneDevice()
    return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross_device_ops)


def placement(devices: list[str]):
    """Where the model is built and fitted: a single replica sits on its device, as its dataset does
    (a DALIDataset on a GPU is iterated there); several replicas, or workers, are placed by the strategy."""
    return tf.device(devices[0]) if len(devices) == 1 and workers.cluster() is None else contextlib.nullcontext()


def use_cpu_threads(threads: int) -> None:
    """TensorFlow's intra-op thread pool: `threads` threads (the pool is made when TensorFlow starts its runtime;
    once started, it keeps its size and a warning says so)."""
    if tf.config.threading.get_intra_op_parallelism_threads() == threads:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError:  # the runtime already started (an earlier run of this process)
        log.warning("cpu_threads=%d: TensorFlow's runtime already started with its own threads: kept", threads)
