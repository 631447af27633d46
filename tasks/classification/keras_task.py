"""The classification task on Keras: model, loss, training metric and validation (scored by
tasks/classification/validation.py), used by the Keras backend (task.sides.keras)."""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf
from keras import ops
from omegaconf import DictConfig

from hydrali.core.contracts.task import KerasSideDefaults
from hydrali.tasks.base import instantiate_network, network_spec
from hydrali.tasks.classification.validation import ClassificationValidation
from hydrali.tasks.keras_fine_tuning import backbone, freeze, start_from


def is_soft(y_true, y_pred) -> bool:
    """Whether labels are soft targets (batch, classes), as a training recipe that mixes gives them, rather than
    class indices (batch, 1). Decided on the static shapes."""
    classes = y_pred.shape[-1]
    return len(y_true.shape) == 2 and classes not in (None, 1) and y_true.shape[-1] == classes


def targets(y_true, y_pred):
    """The labels as probabilities over the classes (batch, classes): soft targets as they are, class indices
    one-hot."""
    if is_soft(y_true, y_pred):
        return ops.cast(y_true, y_pred.dtype)
    labels = ops.reshape(ops.cast(y_true, "int32"), (-1,))
    return ops.one_hot(labels, ops.shape(y_pred)[-1], dtype=y_pred.dtype)


def mean_of_probabilities(first, second):
    """log((softmax(first) + softmax(second)) / 2) in float32: logits whose softmax is the mean of the two."""
    log_probabilities = [ops.log_softmax(ops.cast(logits, "float32"), axis=-1) for logits in (first, second)]
    return ops.logsumexp(ops.stack(log_probabilities), axis=0) - math.log(2.0)


@keras.saving.register_keras_serializable(package="hydrali")
class CrossEntropy(keras.losses.Loss):
    """Cross-entropy on logits with integer labels or soft targets (mixup, cutmix) and label smoothing as torch
    defines it: against (1 - e) * target + e / classes; each sample's loss times its class's weight when
    `class_weights` are given (a soft target's classes' weights, weighted by it; hydrali.core.optim.optimizer).
    Keras averages the per-sample losses over the batch."""

    def __init__(self, label_smoothing: float = 0.0, class_weights=None, name: str = "cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = float(label_smoothing)
        self.class_weights = [float(w) for w in class_weights] if class_weights else None

    def call(self, y_true, y_pred):
        target = targets(y_true, y_pred)
        per_sample = keras.losses.categorical_crossentropy(
            target, y_pred, from_logits=True, label_smoothing=self.label_smoothing
        )
        if self.class_weights is None:
            return per_sample
        weights = ops.convert_to_tensor(self.class_weights, dtype=per_sample.dtype)
        return per_sample * ops.sum(target * weights, axis=-1)

    def get_config(self) -> dict:
        return {**super().get_config(), "label_smoothing": self.label_smoothing, "class_weights": self.class_weights}


def top_one_hits(y_true, y_pred):
    """1.0 per sample whose largest logit is its class (a soft target's largest class), else 0.0."""
    truth = ops.argmax(y_true, axis=-1) if is_soft(y_true, y_pred) else ops.reshape(y_true, (-1,))
    predicted = ops.argmax(y_pred, axis=-1)
    return ops.cast(ops.equal(ops.cast(predicted, "int32"), ops.cast(truth, "int32")), "float32")


@keras.saving.register_keras_serializable(package="hydrali")
class TopOneAccuracy(keras.metrics.MeanMetricWrapper):
    """Top-1 accuracy against class indices or, on training batches that mix, the soft target's largest class."""

    def __init__(self, name: str = "acc", dtype=None):
        super().__init__(fn=top_one_hits, name=name, dtype=dtype)

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype}


class ValidationAccuracy(keras.callbacks.Callback):
    """Puts the validation's top-1 accuracy into the logs of each epoch that validated (val_acc, in place of the
    training metric's own validation value): every Keras worker's counts gathered, so that each reports the
    accuracy over all images."""

    def __init__(self, validation: ClassificationValidation):
        super().__init__()
        self.validation = validation

    def on_test_begin(self, logs=None) -> None:
        self.validation.reset()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if logs is None or "val_loss" not in logs:
            return  # no validation this epoch
        self.validation.gather_across_processes()  # every worker reaches this callback at the same point
        metrics = self.validation.finish(epoch)
        logs.update({"val_" + name.removeprefix("val/"): value for name, value in metrics.items()})


class KerasClassification(KerasSideDefaults):
    """The Keras side of a classification task (hydrali.core.contracts.task.KerasSide): the network of `model`, the
    loss, the training metric, and each validation batch's top-1 classes handed to the framework-neutral
    validation."""

    def __init__(self, task, class_weights=None):
        self.task = task
        self.class_weights = class_weights  # the loss's weight of each class (task.class_weights), None: all 1
        self.validation = ClassificationValidation()

    def build_model(self, model_cfg: DictConfig, num_classes: int, image_size: int) -> keras.Model:
        """The network of `model_cfg`, built through its `keras_target` (a callable returning a keras.Model)."""
        spec = network_spec(model_cfg, "keras")
        model = instantiate_network(spec, num_classes=num_classes, image_size=image_size)
        if not isinstance(model, keras.Model):
            raise TypeError(f"model.keras_target={spec._target_} returned {type(model).__name__}, not a keras.Model")
        freeze(model, model_cfg.get("freeze"))
        return model

    @staticmethod
    def initialise_from(network: keras.Model, trained: keras.Model) -> bool:
        """Start `network` from `trained`, another run's network of the same config (start_from: a new head when the
        number of classes differs); return whether the head was copied too."""
        return start_from(network, trained)

    @staticmethod
    def backbone_variables(network: keras.Model) -> list:
        """The trainable variables of the network's backbone (all but its head), for optim.backbone_lr_mult."""
        return [v for layer in backbone(network) for v in layer.trainable_variables]

    def loss(self) -> keras.losses.Loss:
        """Cross-entropy on logits, with the task's label smoothing and class weights."""
        return CrossEntropy(self.task.label_smoothing, self.class_weights)

    def metrics(self) -> list:
        """Top-1 accuracy of the training batches, logged as `acc` (val/acc comes from the validation, through
        ValidationAccuracy)."""
        return [TopOneAccuracy(name="acc")]

    def on_val_batch(self, data, y_pred, weights) -> None:
        """Hand a validation batch's top-1 classes (taken in the graph, on the device), its labels and each sample's
        weight (0: the shard's padding) to the validation."""
        predicted = tf.argmax(y_pred, axis=-1, output_type=tf.int32)
        labels = tf.reshape(tf.cast(data[1], tf.int32), [-1])
        tf.numpy_function(
            self._collect, [predicted, labels, weights], Tout=tf.int32, stateful=True, name="collect_top_one"
        )

    def _collect(self, predicted, labels, weights) -> np.int32:
        return np.int32(self.validation.add_batch(predicted, labels, weights))

    def evaluation_forward(self, network: keras.Model, images):
        """The class logits that validation (the Keras backend's test step) and predict score: the network's, or
        with task.flip_averaging the log of the mean of its class probabilities on the images (NHWC) and on them
        mirrored left-right."""
        logits = network(images, training=False)
        if not self.task.flip_averaging:
            return logits
        return mean_of_probabilities(logits, network(ops.flip(images, axis=2), training=False))

    prediction_names = ("logits",)  # what `predict` and `serving` return, in this order (hydrali eval, predict)

    def predict(self, network: keras.Model, batch: dict) -> dict:
        """The class logits for a batch's images, flip-averaged with task.flip_averaging (scored by
        tasks/classification/scoring.py)."""
        return {"logits": self.evaluation_forward(network, batch["images"])}

    @staticmethod
    def serving(network: keras.Model, batch: dict) -> dict:
        """What hydrali export writes: the network's own class logits (never flip-averaged)."""
        return {"logits": network(batch["images"], training=False)}

    def callbacks(self) -> list:
        """The callback that puts val_acc, the validation's top-1 accuracy, into each validated epoch's logs."""
        return [ValidationAccuracy(self.validation)]


def build(task, dataset) -> KerasClassification:
    """The Keras side of `task` (its config's task.sides.keras) for `dataset`."""
    return KerasClassification(task, getattr(dataset, "class_weights", None))
