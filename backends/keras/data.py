"""DALI pipelines as Keras input: one endless DALIDataset per replica, distributed PER_REPLICA.

Keras takes hydrali.core.run.epoch's steps from each: `train_steps` per epoch, `val_steps` per validation.
"""

from __future__ import annotations

from typing import Callable

import nvidia.dali.plugin.tf as dali_tf
import tensorflow as tf

from hydrali.core.contracts.run import RunContract

LAYOUT = "HWC"  # the image layout Keras takes (also what core.data.autotune probes with)
# a task's output dtypes, as TensorFlow names them
_TF_DTYPES = {"float": tf.float32, "float16": tf.float16, "int32": tf.int32, "int64": tf.int64}


def data_devices(devices: list[str], dali_device: str) -> list[str]:
    """Where each replica's DALIDataset sits: on its replica's device, or on the CPU when DALI runs there."""
    return [d if dali_device == "gpu" or d.startswith("/cpu") else "/cpu:0" for d in devices]


def distribute(
    strategy: tf.distribute.Strategy,
    devices: list[str],
    dali_device: str,
    replica_dataset: Callable[[int], tf.data.Dataset],
):
    """One dataset per replica, each built where its data sits: `replica_dataset(i)` for replica i (the i-th
    replica of this process). A TF_CONFIG worker drives one replica and reads its own dataset (PER_WORKER:
    MultiWorkerMirroredStrategy has no PER_REPLICA)."""
    where = data_devices(devices, dali_device)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):

        def worker_dataset(context: tf.distribute.InputContext) -> tf.data.Dataset:
            with tf.device(where[0]):
                return replica_dataset(0)

        # PER_WORKER input goes through TensorFlow's MultiDeviceIterator, whose thread fetches ahead from the
        # endless DALIDataset; an iterator that Keras drops (a validation's, at the next one) with a fetch in
        # flight crashed the process (SIGSEGV in DatasetBaseIterator::GetNext). With no buffer it fetches only
        # when a step asks (DALI keeps its own prefetch queue).
        on_demand = tf.distribute.InputOptions(experimental_per_replica_buffer_size=0)
        return strategy.distribute_datasets_from_function(worker_dataset, on_demand)
    if len(devices) == 1:
        with tf.device(where[0]):
            return replica_dataset(0)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        index = context.input_pipeline_id
        with tf.device(where[index]):
            return replica_dataset(index)

    on_device = where == devices  # the data is already where its replica computes
    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=on_device,
        experimental_fetch_to_device=not on_device,
    )
    return strategy.distribute_datasets_from_function(dataset_fn, options)


def dali_dataset(*, task, contract: RunContract, dataset, replica: int, is_training: bool) -> tf.data.Dataset:
    """The DALIDataset of one replica's shard (the task's outputs, NHWC images), endless: Keras counts the steps."""
    shard = contract.plan.shards[replica]
    pipe = contract.pipeline(task, dataset, shard, LAYOUT, is_training)
    return pipeline_dataset(pipe, task=task, contract=contract, device_id=shard.device_id, is_training=is_training)


def pipeline_dataset(pipe, *, task, contract: RunContract, device_id: int | None, is_training: bool) -> tf.data.Dataset:
    """A task's DALI pipeline (not built) as a DALIDataset of its outputs, run with the pipeline's own threads,
    queue depth and executor."""
    specs = task.output_specs(
        batch=contract.plan.per_replica_batch,
        image_size=contract.image_size,
        image_dtype=contract.image_dtype,
        is_training=is_training,
        model=contract.task_inputs.model,
    )
    # a pipeline that reads batches from Python (fn.external_source: a recipe's decode_once) runs as DALI's
    # DALIDatasetWithInputs, which feeds them through tf.data; any other as DALIDataset
    from_memory = dali_tf.experimental.DALIDatasetWithInputs
    dataset_class = from_memory if contract.batches_from_memory else dali_tf.DALIDataset
    return dataset_class(
        pipeline=pipe,
        batch_size=contract.plan.per_replica_batch,
        device_id=device_id,
        # DALIDataset runs the pipeline with its own executor settings (4 threads, ...), not the pipeline's: the
        # pipeline's, so that pipeline.num_threads and prefetch_queue_depth mean on Keras what they mean on Lightning
        num_threads=pipe.num_threads,
        prefetch_queue_depth=pipe.prefetch_queue_depth,
        exec_dynamic=pipe.exec_dynamic,
        output_shapes=tuple(shape for shape, _ in specs),
        output_dtypes=tuple(_TF_DTYPES[d] for _, d in specs),
    )
