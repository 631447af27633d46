"""The SSD multibox loss in Keras 3 (the same per-image values as the torch side): smooth-L1 on the
positive anchors' box offsets plus a class loss, hard-negative-mined cross-entropy or softmax focal loss,
divided by the number of positive anchors."""

from __future__ import annotations

import keras
from keras import ops

from hydrali.tasks.detection.layout import BACKGROUND, BOX_VALUES, LABEL_COLUMN
from hydrali.tasks.detection.spec import CLASS_LOSS_SETTINGS, DetectionLoss, DetectionTaskConfig

SMOOTH_L1_BETA = 1.0  # smooth L1: 0.5 d**2 / beta where |d| < beta, else |d| - 0.5 * beta
DEFAULTS = DetectionTaskConfig  # the loss's settings default to the schema's defaults (task.*)
EXCLUDED_CE = -1.0  # positives' place in the ranking of negatives: below any cross-entropy (>= 0)
MIN_NORMALIZER = 1.0  # images without positives are divided by 1


def smooth_l1(diff):
    """Elementwise smooth L1 (Huber with delta SMOOTH_L1_BETA, scaled as torch's smooth_l1_loss)."""
    size = ops.abs(diff)
    return ops.where(size < SMOOTH_L1_BETA, 0.5 * diff * diff / SMOOTH_L1_BETA, size - 0.5 * SMOOTH_L1_BETA)


def hard_negative_sum(ce, positive, neg_pos_ratio: float):
    """[B] per image: the sum of the k_i largest cross-entropies `ce` [B, N] among its negative anchors, with
    k_i = min(floor(neg_pos_ratio * positives_i), negatives_i) (positive [B, N] bool)."""
    num_pos = ops.sum(ops.cast(positive, "float32"), axis=1)
    num_anchors = ops.cast(ops.shape(ce)[1], "float32")
    k = ops.minimum(ops.floor(neg_pos_ratio * num_pos), num_anchors - num_pos)  # [B]
    negatives_ce = ops.where(positive, EXCLUDED_CE, ce)
    descending = ops.flip(ops.sort(negatives_ce, axis=-1), axis=-1)  # [B, N]
    ranks = ops.cast(ops.arange(ops.shape(ce)[1]), "float32")
    return ops.sum(ops.where(ranks[None, :] < k[:, None], descending, 0.0), axis=1)


def _hard_negative_conf(log_p, positive, neg_pos_ratio: float):
    """[B] cross-entropy over the positives and the hardest negatives (see hard_negative_sum)."""
    return ops.sum(ops.where(positive, -log_p, 0.0), axis=1) + hard_negative_sum(-log_p, positive, neg_pos_ratio)


def _focal_conf(log_p, positive, alpha: float, gamma: float):
    """[B] softmax focal loss over every anchor: alpha for positives, 1 - alpha for background ones."""
    alpha_t = ops.where(positive, alpha, 1.0 - alpha)
    modulation = ops.power(ops.maximum(1.0 - ops.exp(log_p), 0.0), gamma)
    return ops.sum(-alpha_t * modulation * log_p, axis=1)


# task.loss -> its class term [B] of (log p of each anchor's label [B, N], positive [B, N], the loss's settings)
CLASS_LOSSES = {
    DetectionLoss.hard_negatives: lambda log_p, pos, settings: _hard_negative_conf(
        log_p, pos, settings["neg_pos_ratio"]
    ),
    DetectionLoss.focal: lambda log_p, pos, settings: _focal_conf(
        log_p, pos, settings["focal_alpha"], settings["focal_gamma"]
    ),
}


@keras.saving.register_keras_serializable(package="hydrali")
class MultiboxLoss(keras.losses.Loss):
    """The SSD loss per image: (smooth-L1 of the positives' box offsets + class loss) / max(positives, 1).

    y_true: targets [B, N, 5] (encoded offsets, zeros where unmatched; then the label as a float, 0 =
    background); y_pred: raw [B, N, 4 + C] (offsets, then logits with index 0 = background). call returns
    [B]; Keras' reduction then averages it. kind "hard_negatives": cross-entropy over the positives and the
    neg_pos_ratio * positives hardest negatives; kind "focal": softmax focal loss (focal_alpha for object
    anchors, 1 - focal_alpha for background ones; focal_gamma) over every anchor.
    """

    def __init__(
        self,
        kind: str = DEFAULTS.loss,
        neg_pos_ratio: float = DEFAULTS.neg_pos_ratio,
        focal_alpha: float = DEFAULTS.focal_alpha,
        focal_gamma: float = DEFAULTS.focal_gamma,
        name: str = "multibox",
        **kwargs,
    ):
        kind = DetectionLoss.of(kind, "task.loss")
        super().__init__(name=name, **kwargs)
        self.kind = kind.value
        self.class_loss = CLASS_LOSSES[kind]
        self.neg_pos_ratio = float(neg_pos_ratio)
        self.focal_alpha = float(focal_alpha)
        self.focal_gamma = float(focal_gamma)

    def call(self, y_true, y_pred):
        """[B] per-image loss of raw predictions y_pred [B, N, 4 + C] against targets y_true [B, N, 5]."""
        raw, targets = ops.cast(y_pred, "float32"), ops.cast(y_true, "float32")
        labels = ops.cast(ops.round(targets[..., LABEL_COLUMN]), "int32")
        positive = labels > BACKGROUND
        positive_f = ops.cast(positive, "float32")
        num_pos = ops.sum(positive_f, axis=1)
        loc = ops.sum(
            ops.sum(smooth_l1(raw[..., :BOX_VALUES] - targets[..., :BOX_VALUES]), axis=-1) * positive_f, axis=1
        )
        log_probs = ops.log_softmax(raw[..., BOX_VALUES:], axis=-1)
        log_p = ops.squeeze(ops.take_along_axis(log_probs, labels[..., None], axis=-1), axis=-1)  # [B, N]
        conf = self.class_loss(log_p, positive, self.class_settings())
        return (loc + conf) / ops.maximum(num_pos, MIN_NORMALIZER)

    def class_settings(self) -> dict:
        """The class loss's settings (neg_pos_ratio, focal_alpha, focal_gamma), as the constructor took them."""
        return {name: getattr(self, name) for name in CLASS_LOSS_SETTINGS}

    def get_config(self) -> dict:
        """The constructor's arguments (Keras serialization)."""
        return {**super().get_config(), "kind": self.kind, **self.class_settings()}
