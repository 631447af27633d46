"""The run's Keras model built apart, trained by a plain loop: what `pipeline.autotune_by=training` times its
candidates with (hydrali.core.contracts.backend.TrainingProbe). Each step is Keras' own train step of the model a
run compiles (its precision policy, optimizer, schedule and XLA setting), fed by a DALIDataset of the candidate
pipeline as fit() feeds it: the iterator read outside XLA, the batch into the compiled step. It trains on the device
of this process's first replica, outside the run's distribution strategy."""

from __future__ import annotations

import tensorflow as tf

from hydrali.backends.keras.compiled import compile_task_model
from hydrali.backends.keras.data import data_devices, pipeline_dataset
from hydrali.backends.keras.side import build_keras_side
from hydrali.backends.keras.strategy import replica_devices
from hydrali.core.contracts.run import RunContract


class KerasProbe:
    """The model a Keras run of `contract` compiles (its `auto` settings decided as the run will decide them), on
    its first replica's device."""

    def __init__(self, *, contract: RunContract, task, dataset):
        self.task, self.contract, plan = task, contract, contract.plan
        self.device = replica_devices(plan)[0]
        self.data_device = data_devices([self.device], plan.device)[0]
        with tf.device(self.device):
            self.model = compile_task_model(
                contract=contract,
                side=build_keras_side(task, dataset),
                strategy=tf.distribute.get_strategy(),
                dataset=dataset,
            )
            self.one_step = tf.function(lambda data: self.model.train_step(data), jit_compile=contract.compile)

    def steps_on(self, pipe):
        """One training step per call on the next batch of `pipe`, read through a DALIDataset as a run reads it."""
        with tf.device(self.data_device):
            data = pipeline_dataset(
                pipe,
                task=self.task,
                contract=self.contract,
                device_id=self.contract.plan.shards[0].device_id,
                is_training=True,
            )
            iterator = iter(data)

        @tf.function
        def step_on_iterator(iterator):
            return self.one_step(next(iterator))

        def step():
            with tf.device(self.device):
                return step_on_iterator(iterator)

        return step

    def wait(self, logs) -> None:
        """Return once the step that returned `logs` has run: its loss is read back."""
        float(logs["loss"])

    def close(self) -> None:
        """Drop the model and its optimizer."""
        self.model = self.one_step = None
