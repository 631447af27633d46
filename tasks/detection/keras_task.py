"""The detection task on Keras: the SSD network, its multibox loss and its validation, used by the Keras backend."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hydrali.core.contracts.task import KerasSideDefaults
from hydrali.core.distributed.topology import is_first_process
from hydrali.tasks.base import network_spec
from hydrali.tasks.detection.keras_decode import decode_boxes, decode_detections
from hydrali.tasks.detection.keras_loss import MultiboxLoss
from hydrali.tasks.detection.layout import BOX_VALUES, IMAGE_IDS_OUTPUT


class DetectionMetrics(keras.callbacks.Callback):
    """Adds the validation's COCO mAP to the logs of each epoch that validated (val_map, val_map50): every
    Keras worker's detections gathered, so that each worker scores all images; the chief draws the pictures."""

    def __init__(self, validation):
        super().__init__()
        self.validation = validation

    def on_test_begin(self, logs=None) -> None:
        self.validation.evaluator.reset()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if logs is None or "val_loss" not in logs:
            return  # no validation this epoch
        self.validation.gather_across_processes()  # every worker reaches this callback at the same point
        metrics = self.validation.finish(epoch, draw=is_first_process())
        logs.update({"val_" + name.removeprefix("val/"): value for name, value in metrics.items()})


class KerasDetection(KerasSideDefaults):
    """The Keras side of a detection task (hydrali.core.contracts.task.KerasSide): the network of `model`, the
    multibox loss, and the decoding of each validation batch into detections scored by the framework-neutral
    validation."""

    def __init__(self, task, dataset):
        self.task = task
        self.validation = task.validation(dataset)
        self.anchors: np.ndarray | None = None

    def build_model(self, model_cfg: DictConfig, num_classes: int, image_size: int) -> keras.Model:
        """The network described by `model_cfg`, built through its `keras_target` (a callable returning a
        keras.Model mapping [B, S, S, 3] images to [B, N, 4 + 1 + K] raw outputs)."""
        spec = network_spec(model_cfg, "keras")
        model = instantiate(
            spec,
            num_classes=num_classes,
            image_size=image_size,
            anchors=OmegaConf.to_container(model_cfg.anchors, resolve=True),
        )
        if not isinstance(model, keras.Model):
            raise TypeError(f"model.keras_target={spec._target_} returned {type(model).__name__}, not a keras.Model")
        self.anchors = self.task.anchors(model_cfg, image_size)
        return model

    def loss(self) -> keras.losses.Loss:
        """The multibox loss with the task's settings."""
        return MultiboxLoss(**self.task.loss_args())

    def metrics(self) -> list:
        """No Keras metric: mAP is computed over the whole validation by DetectionMetrics."""
        return []

    def on_val_batch(self, data, y_pred, weights) -> None:
        """Decode a validation batch (in the graph) and hand its real samples' detections to the validation."""
        boxes, scores, labels, counts = decode_detections(
            y_pred, tf.constant(self.anchors), **self.task.detection_args()
        )
        tf.numpy_function(
            self._collect,
            [data[IMAGE_IDS_OUTPUT], boxes, scores, labels, counts, weights],
            Tout=tf.int32,
            stateful=True,
            name="collect_detections",
        )

    def _collect(self, image_ids, boxes, scores, labels, counts, weights) -> np.int32:
        real = np.flatnonzero(weights > 0)  # the shard's padding (weight 0) is not scored
        self.validation.add_batch(
            image_ids.reshape(-1)[real].tolist(), boxes[real], scores[real], labels[real], counts=counts[real].tolist()
        )
        return np.int32(len(real))

    prediction_names = ("boxes", "scores", "labels", "counts")  # what `predict` returns (hydrali eval, predict)
    serving_names = ("boxes", "scores")  # what `serving` returns: what hydrali export writes

    def serving(self, network: keras.Model, batch: dict) -> dict:
        """What an exported detector computes (hydrali export), the per-class NMS left to the serving stack: every
        anchor's box, decoded (ltrb in [0, 1] of the resized image) [B, N, 4], and its class probabilities [B, N,
        1 + K] (index 0: background)."""
        raw = tf.cast(network(batch["images"], training=False), tf.float32)
        boxes = tf.clip_by_value(decode_boxes(raw[..., :BOX_VALUES], tf.constant(self.anchors)), 0.0, 1.0)
        return {"boxes": boxes, "scores": tf.nn.softmax(raw[..., BOX_VALUES:], axis=-1)}

    def predict(self, network: keras.Model, batch: dict) -> dict:
        """Each image's detections, padded to max_detections rows: boxes [B, M, 4] ltrb in [0, 1], scores [B, M],
        labels [B, M] (1..K), and counts [B] of real rows (scored by tasks/detection/scoring.py)."""
        raw = network(batch["images"], training=False)
        boxes, scores, labels, counts = decode_detections(
            tf.cast(raw, tf.float32), tf.constant(self.anchors), **self.task.detection_args()
        )
        return {"boxes": boxes, "scores": scores, "labels": labels, "counts": counts}

    def callbacks(self) -> list:
        """The callback that adds val_map and val_map50 to each validated epoch's logs."""
        return [DetectionMetrics(self.validation)]


def build(task, dataset) -> KerasDetection:
    """The Keras side of `task` (its config's task.sides.keras) for `dataset`."""
    return KerasDetection(task, dataset)
