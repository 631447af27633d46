"""The Keras model a run trains: the task's network wrapped in a keras.Model that validates under core's epoch
contract, its sample count metric, and the callback that tells it the validation batch's position.

- validation weighs each sample by hydrali.core.run.epoch's mask: the shard's padding counts for nothing,
- `images` (a weighted metric) counts the samples trained on or scored,
- backend.compile XLA-compiles the train step (jit_compile; on several replicas each replica's forward and
  backward pass, the all-reduce and the update around it) and validation's forward pass (the task's look at
  the batch, such as detection's non-max suppression, stays outside XLA),
- the task's evaluation_forward (what validation scores, e.g. flip averaging) and on_val_batch (its look at each
  validation batch) are called from the validation step.
"""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf
from keras import ops
from keras.src.losses.loss import unscale_loss_for_distribution

from hydrali.backends.keras.resizing import scaled


@keras.saving.register_keras_serializable(package="hydrali")
class SampleCount(keras.metrics.Metric):
    """The number of samples seen (their sample weights summed when given): `images` in the logs."""

    def __init__(self, name: str = "images", **kwargs):
        super().__init__(name=name, **kwargs)
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Add the batch's samples (or its weights' sum)."""
        if sample_weight is None:
            sample_weight = ops.ones((ops.shape(y_pred)[0],), dtype="float32")
        self.count.assign_add(ops.sum(ops.cast(sample_weight, "float32")))

    def result(self):
        """The count so far (a value, not the variable: logs must not change when it is reset)."""
        return ops.convert_to_tensor(self.count) * 1.0

    def reset_state(self):
        self.count.assign(0.0)


class TaskModel(keras.Model):
    """The task's network, trained by Keras' own train step and validated under core's epoch steps:
    sample i of validation batch `val_step` on replica r counts iff val_step * batch + i < the shard's size.
    (A replica's id in sync, counted over every worker of the job, is its shard id.)"""

    def __init__(
        self, network: keras.Model, val_shard_sizes, batch: int, on_val_batch=None, evaluation_forward=None, **kwargs
    ):
        super().__init__(**kwargs)
        self.network = network
        self.on_val_batch = on_val_batch  # the task's look at each validation batch: (data, y_pred, weights)
        self.evaluation_forward = evaluation_forward  # the task's validation output (network, x), else the network's
        self.val_shard_sizes = [int(s) for s in val_shard_sizes]  # one per shard of the job
        self.batch = int(batch)
        self.val_step = keras.Variable(0, dtype="int32", trainable=False, name="val_step")
        self.validation_forward = None  # the XLA-compiled forward pass of validation (make_test_function)
        self.train_size = None  # pixels a side of training batches (progressive_resizing); None: as they come
        self.replica_gradients = None  # the XLA-compiled gradients of one replica, on several (make_train_function)

    def call(self, inputs, training=False):
        return self.network(inputs, training=training)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Keras builds the model's metrics from a first batch, which it reduces across replicas as one nested
        value; MultiWorkerMirroredStrategy reduces only single tensors: take this worker's batch instead."""
        if iterator is not None and isinstance(self.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(
                    lambda value: self.distribute_strategy.experimental_local_results(value)[0], next(it)
                )
                break
            iterator = None
        super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def make_train_function(self, force=False):
        """Keras' training function. With XLA (backend.compile) on one replica, Keras compiles the whole step. On
        several replicas (MirroredStrategy, TF_CONFIG workers) only each replica's forward and backward pass is
        XLA-compiled (`replica_gradients`): the gradients' all-reduce and the optimizer's update, which cross the
        replicas, run as a TensorFlow graph around it. (Keras compiles `strategy.run` over every replica as one XLA
        function, which cannot reach the other devices' variables: keras-team/keras #19005, #18145.)"""
        if not self.jit_compile or self.distribute_strategy.num_replicas_in_sync == 1:
            self.replica_gradients = None
            return super().make_train_function(force)
        self.replica_gradients = tf.function(self._gradients, jit_compile=True, reduce_retracing=True)
        with self._keras_xla_off():
            return super().make_train_function(force)

    def _gradients(self, x, y, sample_weight):
        """One replica's loss (as the loss tracker takes it), predictions and gradients on its batch."""
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            scaled = self.optimizer.scale_loss(loss)  # 16-mixed: the loss scale (else the loss itself)
        return unscale_loss_for_distribution(loss), y_pred, tape.gradient(scaled, self.trainable_weights)

    def train_step(self, data):
        if self.train_size is not None:  # progressive_resizing: a static size, set before the function is traced
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            data = keras.utils.pack_x_y_sample_weight(scaled(x, self.train_size), y, sample_weight)
        if self.replica_gradients is None:
            return self._reducible(super().train_step(data))
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred, gradients = self.replica_gradients(x, y, sample_weight)
        self._loss_tracker.update_state(loss, sample_weight=tf.shape(tf.nest.flatten(x)[0])[0])
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))  # all-reduce, then update
        return self._reducible(self.compute_metrics(x, y, y_pred, sample_weight=sample_weight))

    def make_test_function(self, force=False):
        """Keras' validation function. With XLA (backend.compile) only the network's forward pass is XLA-compiled:
        the rest of the step, the task's look at the batch included (detection's non-max suppression, which XLA
        cannot compile), runs as a TensorFlow graph around it."""
        if not self.jit_compile:
            self.validation_forward = None
            return super().make_test_function(force)
        self.validation_forward = tf.function(self._forward, jit_compile=True, reduce_retracing=True)
        with self._keras_xla_off():
            return super().make_test_function(force)

    @contextlib.contextmanager
    def _keras_xla_off(self):
        """Keras builds its step function without XLA meanwhile (hydrali compiles the parts XLA can take itself);
        jit_compile stays on for the model after."""
        self.jit_compile = False
        try:
            yield
        finally:
            self.jit_compile = True

    def _forward(self, x):
        if self.evaluation_forward is not None:
            return self.evaluation_forward(self.network, x)
        return self(x, training=False)

    def _reducible(self, logs: dict) -> dict:
        """A step's logs as Keras can average them over TF_CONFIG workers: under MultiWorkerMirroredStrategy it
        reduces along axis 0, which a scalar lacks (elsewhere it averages the replicas' scalars as they are)."""
        if not isinstance(self.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return logs
        return {name: ops.reshape(value, (1,)) if len(value.shape) == 0 else value for name, value in logs.items()}

    def valid_mask(self):
        """1.0 for the real samples of this replica's current validation batch, 0.0 for padding."""
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        size = tf.gather(tf.constant(self.val_shard_sizes, dtype="int32"), replica)
        position = self.val_step * self.batch + tf.range(self.batch, dtype="int32")
        return tf.cast(position < size, "float32")

    def test_step(self, data):
        x, y = data[0], data[1]  # further elements (e.g. image ids) are for the task's on_val_batch
        weights = self.valid_mask()
        y_pred = self._forward(x) if self.validation_forward is None else self.validation_forward(x)
        if self.on_val_batch is not None:
            self.on_val_batch(data, y_pred, weights)
        per_sample = self.loss.call(y, ops.cast(y_pred, "float32"))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(per_sample, sample_weight=weights)  # the mean over real samples only
        return self._reducible(self.compute_metrics(x, y, y_pred, sample_weight=weights))


class ValidationPosition(keras.callbacks.Callback):
    """Tells the model which validation batch comes next (the mask of hydrali.core.run.epoch depends on it)."""

    def on_test_batch_begin(self, batch: int, logs=None) -> None:
        self.model.val_step.assign(batch)
