"""Anchors and box coding of the detection task, checked against DALI's real fn.box_encoder (CPU) and
against independent, obviously-correct references (explicit loops, a quadratic Python NMS)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from nvidia.dali import fn, pipeline_def

from hydrali.tasks.detection.anchors import (
    AnchorSpec,
    box_encoder_args,
    decode,
    default_boxes,
    encode,
    num_anchors,
    num_anchors_per_cell,
    spec_for,
)
from hydrali.tasks.detection.layout import BACKGROUND, BOX_VALUES, logits_per_anchor
from hydrali.tasks.detection.torch_decode import batched_nms, decode_boxes, decode_detections

SPEC = spec_for(128, (8, 16, 32))  # feature sizes 16, 8, 4; 4 anchors per cell
ANCHORS = default_boxes(SPEC)
CODE_TOLERANCE = 1e-5  # DALI's offsets vs the numpy reference
BOX_TOLERANCE = 1e-4  # boxes decoded from DALI's offsets vs the ground truth
MATCH_IOU_IN_TESTS = 0.5  # written out here, not imported: the tests pin the value


# ----------------------------------------------------------------------------------------------
# independent references


def reference_iou(a, b) -> float:
    """IoU of two ltrb boxes, in Python floats."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def reference_nms(boxes, scores, classes, threshold) -> list[int]:
    """Greedy per-class NMS, the textbook way: visit by decreasing score, keep a box unless a kept box
    of its class overlaps it by more than the threshold."""
    kept: list[int] = []
    for i in sorted(range(len(scores)), key=lambda i: -scores[i]):
        if all(classes[j] != classes[i] or reference_iou(boxes[i], boxes[j]) <= threshold for j in kept):
            kept.append(i)
    return kept


def reference_anchors(feature_sizes, scales, ratios) -> np.ndarray:
    """SSD default boxes with explicit loops in the documented order: level, row y, column x, anchor."""
    out = []
    for k, f in enumerate(feature_sizes):
        s, s_next = scales[k], scales[k + 1]
        sizes = [(s, s), (math.sqrt(s * s_next), math.sqrt(s * s_next))]
        for r in ratios[k]:
            sizes += [(s * math.sqrt(r), s / math.sqrt(r)), (s / math.sqrt(r), s * math.sqrt(r))]
        for y in range(f):
            for x in range(f):
                cx, cy = (x + 0.5) / f, (y + 0.5) / f
                for w, h in sizes:
                    out.append([min(max(v, 0.0), 1.0) for v in (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)])
    return np.asarray(out)


def dali_box_encoder(images: list[tuple[np.ndarray, np.ndarray]], **overrides) -> list[tuple[np.ndarray, np.ndarray]]:
    """(loc, labels) per image from DALI's CPU fn.box_encoder called with box_encoder_args(ANCHORS)."""
    boxes = [np.asarray(b, np.float32).reshape(-1, 4) for b, _ in images]
    labels = [np.asarray(image_labels, np.int32).reshape(-1) for _, image_labels in images]
    args = {**box_encoder_args(ANCHORS), **overrides}

    @pipeline_def(batch_size=len(images), num_threads=1, device_id=None)
    def encoder():
        box_batch = fn.external_source(source=lambda: boxes)
        label_batch = fn.external_source(source=lambda: labels)
        loc, cls = fn.box_encoder(box_batch, label_batch, **args)
        return loc, cls

    pipe = encoder()
    pipe.build()
    loc, cls = pipe.run()
    return [(np.asarray(loc[i]), np.asarray(cls[i])) for i in range(len(images))]


def ground_truth_images() -> list[tuple[np.ndarray, np.ndarray]]:
    """A few images of boxes with distinct labels (label = index + 1, so a label names its box):
    random boxes, overlapping boxes, a box equal to an anchor, a tiny box that only the forced
    best-anchor match catches, and an image without boxes."""
    rng = np.random.default_rng(7)
    images = []
    for count in (1, 3, 6):
        centre = rng.uniform(0.2, 0.8, (count, 2))
        size = rng.uniform(0.08, 0.6, (count, 2))
        boxes = np.clip(np.concatenate([centre - size / 2, centre + size / 2], 1), 0, 1)
        images.append(boxes)
    images.append(
        np.array(
            [[0.30, 0.30, 0.70, 0.70], [0.32, 0.28, 0.72, 0.66], ANCHORS[700].tolist(), [0.905, 0.905, 0.93, 0.925]]
        )
    )
    images.append(np.zeros((0, 4)))
    return [(b.astype(np.float32), np.arange(1, len(b) + 1, dtype=np.int32)) for b in images]


@pytest.fixture(scope="module")
def encoded():
    """[(boxes, labels, dali_loc, dali_labels)] for ground_truth_images()."""
    images = ground_truth_images()
    return [(boxes, labels, loc, cls) for (boxes, labels), (loc, cls) in zip(images, dali_box_encoder(images))]


# ----------------------------------------------------------------------------------------------
# default boxes


def test_anchor_count_follows_the_spec():
    per_cell = num_anchors_per_cell(SPEC)
    assert SPEC.feature_sizes == (16, 8, 4) and per_cell == (4, 4, 4)
    assert ANCHORS.shape == ((16 * 16 + 8 * 8 + 4 * 4) * 4, 4) == (1344, 4) and ANCHORS.dtype == np.float32
    assert num_anchors(SPEC) == len(ANCHORS)
    spec = AnchorSpec(300, (10, 5), (0.2, 0.5, 0.8), ((2.0,), (2.0, 3.0)))
    assert num_anchors_per_cell(spec) == (4, 6)
    assert len(default_boxes(spec)) == 10 * 10 * 4 + 5 * 5 * 6


def test_anchors_are_clipped_to_the_unit_square():
    assert ANCHORS.min() >= 0 and ANCHORS.max() <= 1
    assert np.all(ANCHORS[:, 2:] > ANCHORS[:, :2])


def test_anchor_order_is_level_row_column_anchor():
    spec = AnchorSpec(96, (6, 3, 1), (0.15, 0.4, 0.7, 0.95), ((2.0,), (2.0, 3.0), ()))
    expected = reference_anchors(spec.feature_sizes, spec.scales, spec.aspect_ratios)
    np.testing.assert_allclose(default_boxes(spec), expected, atol=1e-6)


def test_level0_anchor_centres_sit_on_cell_centres():
    f, per_cell = SPEC.feature_sizes[0], num_anchors_per_cell(SPEC)[0]
    level0 = ANCHORS[: f * f * per_cell].astype(np.float64)
    index = np.arange(len(level0))
    y, x = (index // per_cell) // f, (index // per_cell) % f
    inside = np.all((level0[:, :2] > 0) & (level0[:, 2:] < 1), axis=1)  # clipping moves centres
    assert inside.sum() > len(level0) // 2
    centres = (level0[:, :2] + level0[:, 2:]) / 2
    np.testing.assert_allclose(centres[inside], np.stack([(x + 0.5) / f, (y + 0.5) / f], 1)[inside], atol=1e-6)


def test_spec_errors_name_what_to_fix():
    with pytest.raises(ValueError, match="not a multiple of the strides"):
        spec_for(100, (8, 16, 32))
    with pytest.raises(ValueError, match="scales needs 3 values"):
        AnchorSpec(64, (8, 4), (0.2, 0.5), ((2.0,), (2.0,)))
    with pytest.raises(ValueError, match="aspect_ratios needs one tuple per level"):
        AnchorSpec(64, (8, 4), (0.2, 0.5, 0.9), ((2.0,),))


# ----------------------------------------------------------------------------------------------
# box coding: DALI's real output


def test_numpy_encode_equals_dali_box_encoder(encoded):
    for boxes, labels, dali_loc, dali_labels in encoded:
        loc, cls = encode(boxes, labels, ANCHORS)
        assert dali_loc.shape == loc.shape == (len(ANCHORS), BOX_VALUES) and dali_labels.shape == cls.shape
        np.testing.assert_array_equal(cls, dali_labels)
        np.testing.assert_allclose(loc, dali_loc, atol=CODE_TOLERANCE, rtol=0)


def test_dali_matching_follows_the_ssd_rule(encoded):
    """Checked with a Python IoU: an anchor is labelled with a box when their IoU > 0.5, or when it is
    that box's best anchor (the last one on ties); otherwise it is background (label 0), zero offsets."""
    for boxes, labels, dali_loc, dali_labels in encoded:
        ious = np.zeros((len(boxes), len(ANCHORS)))
        for (i, b), (a, anchor) in itertools.product(enumerate(boxes), enumerate(ANCHORS)):
            ious[i, a] = reference_iou(b, anchor)  # float32 arithmetic, as DALI's: ties stay ties
        # a box's best anchor: on ties (a box containing two anchors of one size) the last one
        best_anchor = {max(range(len(row)), key=lambda a: (row[a], a)) for row in ious.tolist()}
        should_match = (ious > MATCH_IOU_IN_TESTS).any(axis=0)
        for a in best_anchor:
            should_match[a] = True
        np.testing.assert_array_equal(dali_labels > BACKGROUND, should_match)
        assert np.all(dali_loc[dali_labels == BACKGROUND] == 0)
        assert set(dali_labels[dali_labels > BACKGROUND].tolist()) == set(labels.tolist())


def test_decoding_dali_offsets_gives_back_the_ground_truth(encoded):
    for boxes, _, dali_loc, dali_labels in encoded:
        matched = dali_labels > BACKGROUND
        truth = boxes[dali_labels[matched] - 1]  # label = box index + 1
        np.testing.assert_allclose(decode(dali_loc, ANCHORS)[matched], truth, atol=BOX_TOLERANCE, rtol=0)
        torch_boxes = decode_boxes(torch.from_numpy(dali_loc)[None], torch.from_numpy(ANCHORS))[0].numpy()
        np.testing.assert_allclose(torch_boxes[matched], truth, atol=BOX_TOLERANCE, rtol=0)


def test_dali_offsets_are_centre_size_deltas_over_the_stds(encoded):
    """What box_encoder(offset=True) emits, from first principles (not ltrb, whatever its docstring says)."""
    boxes, _, dali_loc, dali_labels = encoded[3]
    anchor = ANCHORS[700].astype(np.float64)  # the box equal to this anchor is label 3
    assert dali_labels[700] == 3 and np.allclose(dali_loc[700], 0, atol=CODE_TOLERANCE)
    a = int(np.flatnonzero(dali_labels == 1)[0])
    b, anchor = boxes[0].astype(np.float64), ANCHORS[a].astype(np.float64)
    aw, ah = anchor[2] - anchor[0], anchor[3] - anchor[1]
    expected = [
        ((b[0] + b[2]) / 2 - (anchor[0] + anchor[2]) / 2) / aw / 0.1,
        ((b[1] + b[3]) / 2 - (anchor[1] + anchor[3]) / 2) / ah / 0.1,
        math.log((b[2] - b[0]) / aw) / 0.2,
        math.log((b[3] - b[1]) / ah) / 0.2,
    ]
    np.testing.assert_allclose(dali_loc[a], expected, atol=CODE_TOLERANCE, rtol=0)


def test_duplicate_boxes_go_to_the_last_one():
    """Two annotations of one box (COCO has some): every anchor ties, and DALI gives all to the last."""
    box = [0.2, 0.25, 0.6, 0.7]
    images = [(np.array([box, box], np.float32), np.array([5, 9], np.int32))]
    ((dali_loc, dali_labels),) = dali_box_encoder(images)
    assert set(dali_labels.tolist()) == {0, 9}
    loc, cls = encode(*images[0], ANCHORS)
    np.testing.assert_array_equal(cls, dali_labels)
    np.testing.assert_allclose(loc, dali_loc, atol=CODE_TOLERANCE, rtol=0)


def test_a_degenerate_box_takes_the_last_anchor_with_infinite_offsets():
    """Why the recipe drops empty boxes and pads ground truth only after fn.box_encoder."""
    images = [(np.array([[0.2, 0.2, 0.6, 0.6], [0.3, 0.3, 0.3, 0.5]], np.float32), np.array([1, 2], np.int32))]
    ((dali_loc, dali_labels),) = dali_box_encoder(images)
    assert dali_labels[-1] == 2 and np.isneginf(dali_loc[-1, 2])
    loc, cls = encode(*images[0], ANCHORS)
    np.testing.assert_array_equal(cls, dali_labels)
    np.testing.assert_allclose(loc, dali_loc, atol=CODE_TOLERANCE, rtol=0)


def test_box_encoder_scale_only_changes_rounding(encoded):
    images = [(boxes, labels) for boxes, labels, _, _ in encoded]
    for (_, _, loc, cls), (loc300, cls300) in zip(encoded, dali_box_encoder(images, scale=300.0)):
        np.testing.assert_array_equal(cls, cls300)
        np.testing.assert_allclose(loc, loc300, atol=CODE_TOLERANCE, rtol=0)


# ----------------------------------------------------------------------------------------------
# NMS


def _nms(boxes, scores, classes, threshold=0.5) -> list[int]:
    return batched_nms(
        torch.tensor(boxes, dtype=torch.float32), torch.tensor(scores), torch.tensor(classes), threshold
    ).tolist()


def test_nms_keeps_the_higher_scoring_of_two_overlapping_boxes():
    boxes = [[0.1, 0.1, 0.5, 0.5], [0.12, 0.1, 0.52, 0.5]]  # IoU ~0.9
    assert _nms(boxes, [0.6, 0.9], [1, 1]) == [1]
    assert _nms(boxes, [0.9, 0.6], [1, 1]) == [0]


def test_nms_never_suppresses_across_classes():
    boxes = [[0.1, 0.1, 0.5, 0.5], [0.12, 0.1, 0.52, 0.5]]
    assert _nms(boxes, [0.6, 0.9], [1, 2]) == [1, 0]


def test_nms_is_greedy_a_suppressed_box_suppresses_nothing():
    boxes = [[0.0, 0.0, 0.4, 0.4], [0.1, 0.0, 0.5, 0.4], [0.2, 0.0, 0.6, 0.4]]  # A~B, B~C, A and C apart
    assert reference_iou(boxes[0], boxes[2]) < 0.5 < reference_iou(boxes[0], boxes[1])
    assert _nms(boxes, [0.9, 0.8, 0.7], [3, 3, 3]) == [0, 2]
    assert _nms([], [], [], 0.5) == []


@pytest.mark.parametrize("seed", range(4))
def test_nms_equals_the_quadratic_reference_on_random_boxes(seed):
    rng = np.random.default_rng(seed)
    n = 300
    centre, size = rng.uniform(0, 1, (n, 2)), rng.uniform(0.05, 0.3, (n, 2))
    boxes = np.concatenate([centre - size / 2, centre + size / 2], 1)
    scores, classes = rng.uniform(0, 1, n), rng.integers(0, 4, n)
    threshold = [0.3, 0.45, 0.5, 0.7][seed]
    kept = batched_nms(torch.from_numpy(boxes), torch.from_numpy(scores), torch.from_numpy(classes), threshold)
    assert kept.tolist() == reference_nms(boxes.tolist(), scores.tolist(), classes.tolist(), threshold)


# ----------------------------------------------------------------------------------------------
# decode_detections()


CONFIDENT_LOGIT = 8.0  # softmax(8 vs 0 for 10 others) ~ 0.997: the class an anchor was encoded with
NUM_CLASSES = 10


def _head_outputs(images, dali_out) -> tuple[torch.Tensor, torch.Tensor]:
    """What a perfect head would emit: DALI's offsets, and logits confident in DALI's label."""
    loc = torch.from_numpy(np.stack([offsets for offsets, _ in dali_out]))
    labels = torch.from_numpy(np.stack([c for _, c in dali_out])).long()
    logits = torch.zeros(len(images), len(ANCHORS), logits_per_anchor(NUM_CLASSES))
    logits.scatter_(2, labels.unsqueeze(-1), CONFIDENT_LOGIT)
    return loc, logits


def _decode_detections(loc, logits, **overrides):
    kwargs = {"score_threshold": 0.05, "iou_threshold": 0.5, "pre_nms_top_k": 200, "max_detections": 100}
    return decode_detections(loc, logits, torch.from_numpy(ANCHORS), **{**kwargs, **overrides})


def test_decoding_finds_the_encoded_boxes():
    images = [
        (
            np.array([[0.1, 0.1, 0.5, 0.6], [0.12, 0.1, 0.52, 0.6], [0.6, 0.55, 0.95, 0.9]], np.float32),
            np.array([4, 7, 4], np.int32),
        ),  # the first two overlap: other classes
        (np.array([[0.2, 0.3, 0.45, 0.5]], np.float32), np.array([10], np.int32)),
        (np.zeros((0, 4), np.float32), np.zeros((0,), np.int32)),
    ]
    loc, logits = _head_outputs(images, dali_box_encoder(images))
    results = _decode_detections(loc, logits)
    assert len(results) == len(images)
    for (truth, truth_labels), (boxes, scores, labels) in zip(images, results):
        assert len(boxes) == len(truth)
        order = np.lexsort((boxes[:, 0].numpy(), labels.numpy()))
        expected = np.lexsort((truth[:, 0], truth_labels))
        np.testing.assert_allclose(boxes.numpy()[order], truth[expected], atol=BOX_TOLERANCE, rtol=0)
        np.testing.assert_array_equal(labels.numpy()[order], truth_labels[expected])
        assert torch.all(scores > 0.99) and torch.all(scores[:-1] >= scores[1:])


def test_decoding_applies_the_threshold_and_the_cap():
    images = [(np.array([[0.1, 0.1, 0.4, 0.4], [0.6, 0.6, 0.9, 0.9]], np.float32), np.array([1, 2], np.int32))]
    loc, logits = _head_outputs(images, dali_box_encoder(images))
    logits[0, :, 2] *= 0.5  # class 2 less confident than class 1
    ((boxes, scores, labels),) = _decode_detections(loc, logits, max_detections=1)
    assert labels.tolist() == [1]
    np.testing.assert_allclose(boxes.numpy(), images[0][0][:1], atol=BOX_TOLERANCE, rtol=0)
    ((boxes, scores, labels),) = _decode_detections(loc, logits, score_threshold=0.999)
    assert len(boxes) == len(scores) == len(labels) == 0
