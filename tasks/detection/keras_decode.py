"""From an SSD head's outputs to detections, in TensorFlow (graph-mode safe, static output sizes): box decoding
(the inverse of DALI's fn.box_encoder, see anchors.py) and per-image detections (softmax, top-k (anchor, class) pairs,
per-class NMS through tf.image.combined_non_max_suppression). torch_decode.py is the torch counterpart."""

from __future__ import annotations

import tensorflow as tf

from hydrali.tasks.detection.anchors import BOX_ENCODER_MEANS, BOX_ENCODER_STDS
from hydrali.tasks.detection.layout import BACKGROUND, BOX_VALUES, FIRST_OBJECT_LABEL

LTRB_TO_YXYX = (1, 0, 3, 2)  # (left, top, right, bottom) <-> (y1, x1, y2, x2): the permutation is its own inverse
BOX_MIN, BOX_MAX = 0.0, 1.0  # normalized coordinates


def decode_boxes(loc, anchors) -> tf.Tensor:
    """[..., N, 4] ltrb boxes (normalized, not clipped) from box offsets loc [..., N, 4], as DALI's
    fn.box_encoder(**box_encoder_args(anchors)) emits them, relative to anchors [N, 4] ltrb (broadcast)."""
    loc = tf.convert_to_tensor(loc)
    anchors = tf.cast(tf.convert_to_tensor(anchors), loc.dtype)
    anchor_centre = 0.5 * (anchors[..., :2] + anchors[..., 2:])
    anchor_size = anchors[..., 2:] - anchors[..., :2]
    raw = loc * tf.constant(BOX_ENCODER_STDS, loc.dtype) + tf.constant(BOX_ENCODER_MEANS, loc.dtype)
    centre = anchor_centre + raw[..., :2] * anchor_size
    half = 0.5 * anchor_size * tf.exp(raw[..., 2:])
    return tf.concat([centre - half, centre + half], axis=-1)


def _swap_ltrb_yxyx(boxes: tf.Tensor) -> tf.Tensor:
    """ltrb -> yxyx, or yxyx -> ltrb."""
    return tf.gather(boxes, LTRB_TO_YXYX, axis=-1)


def _top_candidates(raw: tf.Tensor, anchors, pre_nms_top_k: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Per image, the pre_nms_top_k best (anchor, class) pairs over all foreground classes, as torch_decode
    picks them: their boxes [B, k, 4] ltrb clipped to [0, 1], and scores [B, k, K] holding each pair's softmax
    probability at its class and 0 elsewhere (so that NMS sees each pair under its own class only)."""
    foreground = tf.nn.softmax(raw[..., BOX_VALUES:], axis=-1)[..., FIRST_OBJECT_LABEL:]  # [B, N, K]
    num_classes = foreground.shape[-1]
    flat = tf.reshape(foreground, (tf.shape(foreground)[0], -1))  # [B, N * K]
    pairs = flat.shape[1]  # static where known, so that k (and the shapes after it) is static too
    k = min(pre_nms_top_k, pairs) if pairs is not None else tf.minimum(pre_nms_top_k, tf.shape(flat)[1])
    score, index = tf.math.top_k(flat, k=k, sorted=True)  # [B, k]
    anchor_index, class_index = index // num_classes, index % num_classes
    loc = tf.gather(raw[..., :BOX_VALUES], anchor_index, batch_dims=1)
    boxes = tf.clip_by_value(decode_boxes(loc, tf.gather(anchors, anchor_index)), BOX_MIN, BOX_MAX)
    return boxes, tf.one_hot(class_index, num_classes, dtype=score.dtype) * score[..., None]


def decode_detections(
    raw, anchors, *, score_threshold: float, iou_threshold: float, pre_nms_top_k: int, max_detections: int
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Detections per image from the model's output raw [B, N, 4 + 1 + K] against anchors [N, 4] ltrb:
    boxes [B, M, 4] ltrb in [0, 1], scores [B, M], labels [B, M] int32 (1..K), counts [B] int32, M =
    max_detections; per image the first counts[i] rows are its detections by decreasing score, the rest
    are padding (zeros; label 0 = BACKGROUND).

    Candidates: the pre_nms_top_k best (anchor, class) pairs by softmax probability, those scoring
    > score_threshold (as torch_decode.decode_detections); then per-class NMS (a box is dropped when a better kept box
    of its class has IoU > iou_threshold) on the clipped boxes, and the best max_detections of what remains.
    """
    raw = tf.cast(tf.convert_to_tensor(raw), tf.float32)
    anchors = tf.cast(anchors, tf.float32)
    boxes, scores = _top_candidates(raw, anchors, pre_nms_top_k)
    nms = tf.image.combined_non_max_suppression(
        _swap_ltrb_yxyx(boxes)[:, :, None, :],
        scores,
        max_output_size_per_class=max_detections,
        max_total_size=max_detections,
        iou_threshold=iou_threshold,
        score_threshold=score_threshold,
        pad_per_class=False,
        clip_boxes=True,
    )
    counts = tf.cast(nms.valid_detections, tf.int32)
    valid = tf.range(max_detections)[None, :] < counts[:, None]
    labels = tf.where(valid, tf.cast(nms.nmsed_classes, tf.int32) + FIRST_OBJECT_LABEL, BACKGROUND)
    return _swap_ltrb_yxyx(nms.nmsed_boxes), nms.nmsed_scores, labels, counts
