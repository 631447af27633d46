"""The SSD multibox loss in Keras 3 (the same per-image values as the torch side): smooth-L1 on the
positive anchors' box offsets plus a class loss, hard-negative-mined cross-entropy or softmax focal loss,
divided by the number of positive anchors."""
from __future__ import annotations

import keras
from keras import ops

from hydrali.tasks.detection.anchors import BACKGROUND

BOX_CODES = 4  # raw[..., :4] and targets[..., :4]: box offsets; then the logits / the label
LABEL_COLUMN = 4  # targets[..., 4]: the anchor's label as a float (0 background, 1..K)
SMOOTH_L1_BETA = 1.0  # smooth L1: 0.5 d**2 / beta where |d| < beta, else |d| - 0.5 * beta
KINDS = ("hard_negatives", "focal")
DEFAULT_NEG_POS_RATIO = 3.0
DEFAULT_FOCAL_ALPHA = 0.25
DEFAULT_FOCAL_GAMMA = 2.0
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
    k = ops.minimum(ops.floor(neg_pos_ratio * num_pos), num_anchors - num_pos)          # [B]
    negatives_ce = ops.where(positive, EXCLUDED_CE, ce)
    descending = ops.flip(ops.sort(negatives_ce, axis=-1), axis=-1)                       # [B, N]
    ranks = ops.cast(ops.arange(ops.shape(ce)[1]), "float32")
    return ops.sum(ops.where(ranks[None, :] < k[:, None], descending, 0.0), axis=1)


@keras.saving.register_keras_serializable(package="hydrali")
class MultiboxLoss(keras.losses.Loss):
    """The SSD loss per image: (smooth-L1 of the positives' box offsets + class loss) / max(positives, 1).

    y_true: targets [B, N, 5] (encoded offsets, zeros where unmatched; then the label as a float, 0 =
    background); y_pred: raw [B, N, 4 + C] (offsets, then logits with index 0 = background). call returns
    [B]; Keras' reduction then averages it. kind "hard_negatives": cross-entropy over the positives and the
    neg_pos_ratio * positives hardest negatives; kind "focal": softmax focal loss (focal_alpha for object
    anchors, 1 - focal_alpha for background ones; focal_gamma) over every anchor.
    """

    def __init__(self, kind: str = "hard_negatives", neg_pos_ratio: float = DEFAULT_NEG_POS_RATIO,
                 focal_alpha: float = DEFAULT_FOCAL_ALPHA, focal_gamma: float = DEFAULT_FOCAL_GAMMA,
                 name: str = "multibox", **kwargs):
        if kind not in KINDS:
            raise ValueError(f"task.loss={kind!r}: choose one of {', '.join(KINDS)}")
        super().__init__(name=name, **kwargs)
        self.kind = kind
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
        loc = ops.sum(ops.sum(smooth_l1(raw[..., :BOX_CODES] - targets[..., :BOX_CODES]), axis=-1) * positive_f,
                      axis=1)
        log_probs = ops.log_softmax(raw[..., BOX_CODES:], axis=-1)
        log_p = ops.squeeze(ops.take_along_axis(log_probs, labels[..., None], axis=-1), axis=-1)   # [B, N]
        conf = self._hard_negatives(-log_p, positive) if self.kind == "hard_negatives" else self._focal(log_p, positive)
        return (loc + conf) / ops.maximum(num_pos, MIN_NORMALIZER)

    def _hard_negatives(self, ce, positive):
        return ops.sum(ops.where(positive, ce, 0.0), axis=1) + hard_negative_sum(ce, positive, self.neg_pos_ratio)

    def _focal(self, log_p, positive):
        alpha = ops.where(positive, self.focal_alpha, 1.0 - self.focal_alpha)
        modulation = ops.power(ops.maximum(1.0 - ops.exp(log_p), 0.0), self.focal_gamma)
        return ops.sum(-alpha * modulation * log_p, axis=1)

    def get_config(self) -> dict:
        """The constructor's arguments (Keras serialization)."""
        return {**super().get_config(), "kind": self.kind, "neg_pos_ratio": self.neg_pos_ratio,
                "focal_alpha": self.focal_alpha, "focal_gamma": self.focal_gamma}
