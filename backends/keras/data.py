"""DALI pipelines as Keras input: one DALIDataset per replica, distributed PER_REPLICA."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import nvidia.dali.plugin.tf as dali_tf
import tensorflow as tf

from core.errors import HydraliError
from core.plan import Plan, Shard

_TF_DTYPES = {"float": tf.float32, "float16": tf.float16}


def steps_per_epoch(num_samples: int, num_shards: int, batch_size: int) -> int:
    """Batches in one epoch of a shard: the reader pads every shard to ceil(N / shards) samples
    (pad_last_batch) and to whole batches, so every replica takes the same number of steps."""
    return math.ceil(math.ceil(num_samples / num_shards) / batch_size)


def reader_epoch_size(*, task, cfg, dataset, plan: Plan, is_training: bool) -> int:
    """The number of files DALI's reader finds for a split (built once on the CPU, never run)."""
    cpu_plan = dataclasses.replace(plan, device="cpu")
    pipe = task.build_pipeline(pipeline=cfg.pipeline, data=cfg.data, dataset=dataset, plan=cpu_plan,
                               shard=Shard(0, None, 0), layout="HWC", is_training=is_training)
    pipe.build()
    return int(pipe.epoch_size("Reader"))


def check_shards_hold_a_batch(num_samples: int, plan: Plan, split: str) -> None:
    """Fail, saying what to change, when a replica's shard holds fewer samples than one batch."""
    per_shard = num_samples // plan.num_shards
    if per_shard < plan.per_replica_batch:
        raise HydraliError(
            f"the {split} split has {num_samples} images: over {plan.num_shards} replicas a shard holds "
            f"{per_shard}, fewer than data.batch_size={plan.per_replica_batch}: lower backend.replicas "
            f"or data.batch_size")


def distribute(strategy: tf.distribute.Strategy, devices: list[str],
               replica_dataset: Callable[[int], tf.data.Dataset]):
    """One dataset per replica, each built on its replica's device: `replica_dataset(i)` for replica i."""
    if len(devices) == 1:
        with tf.device(devices[0]):
            return replica_dataset(0)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        index = context.input_pipeline_id
        with tf.device(devices[index]):
            return replica_dataset(index)

    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=True, experimental_fetch_to_device=False)
    return strategy.distribute_datasets_from_function(dataset_fn, options)


def dali_dataset(*, task, cfg, dataset, plan: Plan, replica: int, is_training: bool,
                 labels_shape: tuple) -> tf.data.Dataset:
    """The DALIDataset of one replica's shard (NHWC images, integer labels), endless: Keras counts the steps."""
    shard = plan.shards[replica]
    pipe = task.build_pipeline(pipeline=cfg.pipeline, data=cfg.data, dataset=dataset, plan=plan, shard=shard,
                               layout="HWC", is_training=is_training)
    size, batch = cfg.data.image_size, plan.per_replica_batch
    return dali_tf.DALIDataset(
        pipeline=pipe, batch_size=batch, device_id=shard.device_id,
        output_shapes=((batch, size, size, 3), (batch, *labels_shape)),
        output_dtypes=(_TF_DTYPES[str(cfg.pipeline.dtype)], tf.int32))
