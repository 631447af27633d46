"""The Keras side of the SSD detector: network layout (anchor order contract), loss against a numpy reference,
box decoding and detections against numpy / torch, and the classification ResNet left as it was."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hydrali.backends.keras.quiet_start import import_tensorflow
from hydrali.core.errors import HydraliError

pytestmark = pytest.mark.keras

tf = import_tensorflow()

import keras  # noqa: E402
import torch  # noqa: E402

from hydrali.tasks.classification.keras_model import ResNet, resnet_features  # noqa: E402
from hydrali.tasks.detection import anchors as anchor_lib  # noqa: E402
from hydrali.tasks.detection import torch_decode  # noqa: E402
from hydrali.tasks.detection.keras_decode import decode_boxes, decode_detections  # noqa: E402
from hydrali.tasks.detection.keras_loss import CLASS_LOSSES, MultiboxLoss  # noqa: E402
from hydrali.tasks.detection.keras_model import SSD  # noqa: E402
from hydrali.tasks.detection.layout import BACKGROUND, BOX_VALUES, LABEL_COLUMN  # noqa: E402
from hydrali.tasks.detection.spec import DetectionLoss  # noqa: E402

SMALL = {"layers": [1, 1, 1, 1], "widths": [32, 64, 128, 256], "stem": "imagenet"}  # conf/model/ssd_small.yaml
ANCHORS = {"strides": [8, 16, 32], "min_scale": 0.1, "max_scale": 0.9, "aspect_ratios": [2.0]}
IMAGE = 128
CLASSES = 3


def _trainable(model: keras.Model) -> int:
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


@pytest.fixture(scope="module")
def small_ssd() -> keras.Model:
    keras.utils.set_random_seed(0)
    return SSD(CLASSES, IMAGE, anchors=ANCHORS, **SMALL)


@pytest.fixture(scope="module")
def spec() -> anchor_lib.AnchorSpec:
    return anchor_lib.anchor_spec(IMAGE, ANCHORS)


# ---------------------------------------------------------------- network


def test_output_is_one_float32_tensor_per_anchor(small_ssd, spec):
    images = np.random.default_rng(0).normal(size=(2, IMAGE, IMAGE, 3)).astype(np.float32)
    raw = small_ssd(images, training=False)
    assert tuple(raw.shape) == (2, anchor_lib.num_anchors(spec), 4 + CLASSES + 1) == (2, 1344, 8)
    assert raw.dtype == "float32"


def test_trainable_parameters_are_the_backbone_plus_the_heads(small_ssd, spec):
    resnet = ResNet(10, IMAGE, **SMALL)
    backbone = _trainable(resnet) - (256 * 10 + 10)  # without the classifier
    heads = sum(
        (3 * 3 * cin + 1) * a * (4 + CLASSES + 1)
        for cin, a in zip([64, 128, 256], anchor_lib.num_anchors_per_cell(spec))
    )
    assert _trainable(small_ssd) == backbone + heads


def test_same_trainable_parameters_as_torch(small_ssd):
    from hydrali.tasks.detection.torch_model import SSD as TorchSSD

    for args, anchors in [
        (SMALL, ANCHORS),
        (
            {"block": "bottleneck", "layers": [1, 2, 1], "widths": [8, 16, 32], "stem": "small"},
            {"strides": [2, 4], "aspect_ratios": [2.0, 3.0]},
        ),
    ]:
        keras_model = small_ssd if args is SMALL else SSD(CLASSES, 32, anchors=anchors, **args)
        torch_model = TorchSSD(CLASSES, IMAGE if args is SMALL else 32, anchors=anchors, **args)
        assert _trainable(keras_model) == sum(p.numel() for p in torch_model.parameters() if p.requires_grad)


def test_class_head_bias_starts_at_zero(small_ssd):
    for level in range(3):
        assert not np.any(small_ssd.get_layer(f"class_head_{level}").bias.numpy())


def test_rows_follow_the_anchor_order_contract(small_ssd, spec):
    """raw[b, offset(l) + (y * f + x) * A + a, j] is channel a * k + j of level l's head at cell (y, x)."""
    heads = [small_ssd.get_layer(f"{kind}_head_{level}").output for level in range(3) for kind in ("loc", "class")]
    probe = keras.Model(small_ssd.input, [small_ssd.output, *heads])
    images = np.random.default_rng(1).normal(size=(2, IMAGE, IMAGE, 3)).astype(np.float32)
    raw, *maps = [np.asarray(t) for t in probe(images, training=False)]
    offset, per_cell = 0, anchor_lib.num_anchors_per_cell(spec)
    for level, (f, anchors) in enumerate(zip(spec.feature_sizes, per_cell)):
        loc_map, class_map = maps[2 * level], maps[2 * level + 1]
        for y, x, a in [(0, 0, 0), (0, f - 1, 1), (f - 1, 0, anchors - 1), (f // 2, f // 3, 2)]:
            row = offset + (y * f + x) * anchors + a
            np.testing.assert_array_equal(raw[:, row, :4], loc_map[:, y, x, a * 4 : (a + 1) * 4])
            np.testing.assert_array_equal(raw[:, row, 4:], class_map[:, y, x, a * 4 : (a + 1) * 4])
        offset += f * f * anchors


def test_a_lit_class_channel_lands_on_its_anchor_rows(spec):
    keras.utils.set_random_seed(2)
    model = SSD(CLASSES, IMAGE, anchors=ANCHORS, **SMALL)
    level, anchor, cls, value = 1, 2, 3, 7.0
    head = model.get_layer(f"class_head_{level}")
    channels = head.bias.shape[0]
    bias = np.zeros(channels, np.float32)
    bias[anchor * (CLASSES + 1) + cls] = value
    head.set_weights([np.zeros(head.kernel.shape, np.float32), bias])
    raw = np.asarray(model(np.ones((1, IMAGE, IMAGE, 3), np.float32), training=False))[0]
    per_cell, f = anchor_lib.num_anchors_per_cell(spec), spec.feature_sizes
    start = f[0] * f[0] * per_cell[0]
    level_rows = raw[start : start + f[level] ** 2 * per_cell[level], 4:]  # [f * f * A, C]
    lit = np.zeros_like(level_rows)
    lit[[(y * f[level] + x) * per_cell[level] + anchor for y in range(f[level]) for x in range(f[level])], cls] = value
    np.testing.assert_array_equal(level_rows, lit)


def test_stride_no_stage_produces_is_refused():
    with pytest.raises(ValueError, match=r"model\.anchors\.strides.*64.*offers strides 4, 8, 16, 32"):
        SSD(CLASSES, IMAGE, anchors={"strides": [8, 16, 64]}, **SMALL)
    with pytest.raises(ValueError, match=r"model\.anchors\.strides.*offers strides 1, 2, 4, 8"):
        SSD(CLASSES, IMAGE, anchors={"strides": [16]}, **{**SMALL, "stem": "small"})
    with pytest.raises(ValueError, match="image size 120"):
        SSD(CLASSES, 120, anchors=ANCHORS, **SMALL)


def test_mixed_precision_output_is_float32():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = SSD(CLASSES, 64, anchors={"strides": [16, 32]}, **SMALL)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.get_layer("class_head_0").compute_dtype == "float16"
    assert model.output.dtype == "float32"


# ---------------------------------------------------------------- loss


def _reference_loss(
    raw: np.ndarray, targets: np.ndarray, kind: str, ratio: float = 3.0, alpha: float = 0.25, gamma: float = 2.0
) -> np.ndarray:
    """The spec's per-image loss, one image and one anchor at a time, in float64."""
    raw, targets = raw.astype(np.float64), targets.astype(np.float64)
    losses = []
    for r, t in zip(raw, targets):
        labels = np.rint(t[:, LABEL_COLUMN]).astype(int)
        positives = [n for n in range(len(r)) if labels[n] > BACKGROUND]
        loc = 0.0
        for n in positives:
            for j in range(BOX_VALUES):
                d = r[n, j] - t[n, j]
                loc += 0.5 * d * d if abs(d) < 1 else abs(d) - 0.5
        logits = r[:, BOX_VALUES:]
        log_softmax = logits - logits.max(axis=1, keepdims=True)
        log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
        log_p = np.array([log_softmax[n, labels[n]] for n in range(len(r))])
        if kind == "hard_negatives":
            k = min(int(np.floor(ratio * len(positives))), len(r) - len(positives))
            negatives = sorted((-log_p[n] for n in range(len(r)) if labels[n] == 0), reverse=True)
            conf = sum(-log_p[n] for n in positives) + sum(negatives[:k])
        else:
            conf = 0.0
            for n in range(len(r)):
                a = alpha if labels[n] > 0 else 1 - alpha
                conf += -a * (1 - np.exp(log_p[n])) ** gamma * log_p[n]
        losses.append((loc + conf) / max(len(positives), 1))
    return np.array(losses)


@pytest.fixture(scope="module")
def loss_case() -> tuple[np.ndarray, np.ndarray]:
    """3 images of 20 anchors, 4 classes: 2 positives (k = 6), none (k = 0), 17 (k capped at N - 17 = 3)."""
    rng = np.random.default_rng(3)
    batch, anchors, classes = 3, 20, 4
    raw = (2 * rng.normal(size=(batch, anchors, BOX_VALUES + classes))).astype(np.float32)
    labels = np.zeros((batch, anchors))
    labels[0, [3, 11]] = [1, 3]
    labels[2, rng.permutation(anchors)[:17]] = rng.integers(1, classes, 17)
    loc = np.where(labels[..., None] > BACKGROUND, rng.normal(size=(batch, anchors, BOX_VALUES)), 0.0)
    targets = np.concatenate([loc, labels[..., None]], axis=-1).astype(np.float32)
    return raw, targets


@pytest.mark.parametrize(
    "kind,args",
    [
        ("hard_negatives", {}),
        ("hard_negatives", {"neg_pos_ratio": 1.5}),
        ("focal", {}),
        ("focal", {"focal_alpha": 0.6, "focal_gamma": 1.5}),
    ],
)
def test_loss_matches_the_numpy_reference(loss_case, kind, args):
    raw, targets = loss_case
    reference = _reference_loss(
        raw, targets, kind, args.get("neg_pos_ratio", 3.0), args.get("focal_alpha", 0.25), args.get("focal_gamma", 2.0)
    )
    loss = MultiboxLoss(kind, **args)
    per_image = np.asarray(loss.call(tf.constant(targets), tf.constant(raw)))
    assert per_image.shape == (3,)
    np.testing.assert_allclose(per_image, reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(loss(targets, raw)), reference.mean(), rtol=1e-5)
    graph = tf.function(lambda t, r: loss.call(t, r))(tf.constant(targets), tf.constant(raw))
    np.testing.assert_allclose(np.asarray(graph), reference, rtol=1e-5, atol=1e-5)
    if kind == "hard_negatives":
        assert per_image[1] == 0, "no positives: no box loss and k = 0 negatives"


def test_the_loss_computes_exactly_the_schemas_kinds_each_its_own_way(loss_case):
    """task.loss's choices (the schema's DetectionLoss) are the kinds the loss's table holds (as on torch); each is
    taken as the config passes it (a string) and gives its own values."""
    assert set(CLASS_LOSSES) == set(DetectionLoss)
    raw, targets = loss_case
    losses = {
        kind.value: np.asarray(MultiboxLoss(kind.value).call(tf.constant(targets), tf.constant(raw)))
        for kind in DetectionLoss
    }
    assert len({values.tobytes() for values in losses.values()}) == len(losses), losses


def test_loss_serializes_and_refuses_unknown_kinds():
    loss = MultiboxLoss("focal", focal_alpha=0.5, focal_gamma=1.0)
    config = keras.saving.serialize_keras_object(loss)
    assert config["registered_name"] == "hydrali>MultiboxLoss"
    again = keras.saving.deserialize_keras_object(config)
    assert (again.kind, again.focal_alpha, again.focal_gamma, again.neg_pos_ratio) == ("focal", 0.5, 1.0, 3.0)
    refusal = f"task.loss='smooth': choose one of {', '.join(DetectionLoss.values())}"
    with pytest.raises(HydraliError, match=re.escape(refusal)):
        MultiboxLoss("smooth")


# ---------------------------------------------------------------- decoding and detections


def test_decode_boxes_inverts_the_encoder():
    spec = anchor_lib.anchor_spec(64, {"strides": [8, 16, 32]})
    default = anchor_lib.default_boxes(spec)
    rng = np.random.default_rng(4)
    lt = rng.uniform(0, 0.6, size=(6, 2))
    boxes = np.concatenate([lt, lt + rng.uniform(0.1, 0.4, size=(6, 2))], axis=1).astype(np.float32)
    loc, cls = anchor_lib.encode(boxes, np.arange(1, 7), default)
    matched = cls > 0
    decoded = np.asarray(decode_boxes(loc[None], default))[0]
    match = anchor_lib.match_anchors(boxes, default)
    np.testing.assert_allclose(decoded[matched], boxes[match[matched]], atol=1e-4)
    offsets = rng.normal(size=(2, len(default), 4)).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(decode_boxes(offsets, default)), anchor_lib.decode(offsets, default), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(decode_boxes(offsets, default)),
        torch_decode.decode_boxes(torch.from_numpy(offsets), torch.from_numpy(default)).numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


DETECT_SPEC = anchor_lib.anchor_spec(64, {"strides": [16, 32]})  # 80 anchors
DETECT_CLASSES = 3


def _detection_case(seed: int) -> np.ndarray:
    """raw [2, 80, 8]: background wins everywhere but at a few anchors, some of them neighbours (overlapping
    boxes, for NMS), one of them lit for two classes."""
    rng = np.random.default_rng(seed)
    anchors = anchor_lib.num_anchors(DETECT_SPEC)
    logits = rng.normal(scale=0.3, size=(2, anchors, DETECT_CLASSES + 1))
    logits[..., 0] += 4.0
    for image in range(2):
        for anchor in rng.choice(anchors, size=10, replace=False).tolist() + [0, 1, 2, 3, 5, 64]:
            logits[image, anchor, rng.integers(1, DETECT_CLASSES + 1)] = rng.uniform(4, 9)
        logits[image, 64, 1:3] = [6.5, 6.0]
    loc = rng.normal(scale=0.5, size=(2, anchors, BOX_VALUES))
    return np.concatenate([loc, logits], axis=-1).astype(np.float32)


def _torch_decode_detections(raw: np.ndarray, anchors: np.ndarray, **args) -> list:
    tensor = torch.from_numpy(raw)
    return torch_decode.decode_detections(
        tensor[..., :BOX_VALUES], tensor[..., BOX_VALUES:], torch.from_numpy(anchors), **args
    )


@pytest.mark.parametrize(
    "seed,max_detections,top_k", [(5, 100, None), (6, 100, None), (7, 4, None), (5, 100, 20), (6, 10, 7)]
)
def test_decoding_agrees_with_torch(seed, max_detections, top_k):
    """The same candidates (the top_k best (anchor, class) pairs; None: all), the same NMS, the same cap."""
    raw = _detection_case(seed)
    top_k = top_k or anchor_lib.num_anchors(DETECT_SPEC) * DETECT_CLASSES
    args = {"score_threshold": 0.05, "iou_threshold": 0.5, "max_detections": max_detections, "pre_nms_top_k": top_k}
    default = anchor_lib.default_boxes(DETECT_SPEC)
    boxes, scores, labels, counts = (np.asarray(t) for t in decode_detections(raw, default, **args))
    expected = _torch_decode_detections(raw, default, **args)
    assert boxes.shape == (2, max_detections, 4) and labels.dtype == np.int32 and counts.dtype == np.int32
    for i, (torch_boxes, torch_scores, torch_labels) in enumerate(expected):
        n = int(counts[i])
        assert n == len(torch_scores) and n > 0
        np.testing.assert_allclose(boxes[i, :n], torch_boxes.numpy(), atol=1e-5)
        np.testing.assert_allclose(scores[i, :n], torch_scores.numpy(), atol=1e-5)
        np.testing.assert_array_equal(labels[i, :n], torch_labels.numpy())
        assert np.all(np.diff(scores[i, :n]) <= 0) and np.all((boxes >= 0) & (boxes <= 1))
        assert not np.any(boxes[i, n:]) and not np.any(scores[i, n:]) and not np.any(labels[i, n:])
    if max_detections < 10:
        assert counts.tolist() == [max_detections] * 2
    elif top_k > 20:
        assert (labels[..., None] == np.arange(1, DETECT_CLASSES + 1)).any(axis=(0, 1)).all(), "every class shows"


def test_boxes_are_clipped_before_nms_as_on_torch():
    """A box half outside the image overlaps its clipped twin by IoU 0.5 unclipped, 1 clipped: NMS at 0.7 drops
    the twin only when it compares clipped boxes (tf's clip_boxes clips the output only)."""
    anchors = np.array([[-0.5, 0, 0.5, 1], [0, 0, 0.5, 1], [0.6, 0.6, 0.9, 0.9]], np.float32)
    probs = np.array([[0.1, 0.9], [0.2, 0.8], [0.3, 0.7]])
    raw = np.concatenate([np.zeros((3, BOX_VALUES)), np.log(probs)], axis=-1)[None].astype(np.float32)
    args = {"score_threshold": 0.05, "iou_threshold": 0.7, "pre_nms_top_k": 3, "max_detections": 5}
    boxes, scores, labels, counts = (np.asarray(t) for t in decode_detections(raw, anchors, **args))
    [(torch_boxes, torch_scores, _)] = _torch_decode_detections(raw, anchors, **args)
    assert counts.tolist() == [2] and labels[0, :2].tolist() == [1, 1]
    np.testing.assert_allclose(scores[0, :2], [0.9, 0.7], rtol=1e-6)
    np.testing.assert_allclose(boxes[0, :2], [[0, 0, 0.5, 1], [0.6, 0.6, 0.9, 0.9]], atol=1e-6)
    np.testing.assert_allclose(boxes[0, :2], torch_boxes.numpy(), atol=1e-6)
    np.testing.assert_allclose(scores[0, :2], torch_scores.numpy(), atol=1e-6)


def test_pre_nms_top_k_keeps_the_best_pair():
    raw = _detection_case(8)
    default = anchor_lib.default_boxes(DETECT_SPEC)
    boxes, scores, labels, counts = decode_detections(
        raw, default, score_threshold=0.05, iou_threshold=0.5, pre_nms_top_k=1, max_detections=10
    )
    foreground = tf.nn.softmax(raw[..., BOX_VALUES:])[..., 1:].numpy().reshape(2, -1)
    best = foreground.argmax(axis=1)
    anchor, label = best // DETECT_CLASSES, best % DETECT_CLASSES + 1
    boxes_of_best = np.clip(anchor_lib.decode(raw[..., :BOX_VALUES], default), 0, 1)[np.arange(2), anchor]
    assert np.asarray(counts).tolist() == [1, 1]
    np.testing.assert_allclose(np.asarray(boxes)[:, 0], boxes_of_best, atol=1e-6)
    np.testing.assert_allclose(np.asarray(scores)[:, 0], foreground.max(axis=1), rtol=1e-6)
    assert np.asarray(labels)[:, 0].tolist() == label.tolist()


@pytest.mark.parametrize("num_anchors", [80, None])
def test_decoding_runs_as_a_tf_function(num_anchors):
    raw = _detection_case(9)
    default = anchor_lib.default_boxes(DETECT_SPEC)
    args = {"score_threshold": 0.05, "iou_threshold": 0.5, "pre_nms_top_k": 50, "max_detections": 7}

    @tf.function(input_signature=[tf.TensorSpec([None, num_anchors, 4 + DETECT_CLASSES + 1], tf.float32)])
    def graph_decode(batch):
        return decode_detections(batch, default, **args)

    graph = graph_decode(tf.constant(raw))
    assert graph[0].shape[1:] == (7, 4) if num_anchors is None else tuple(graph[0].shape) == (2, 7, 4)
    for g, e in zip(graph, decode_detections(raw, default, **args)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e))


# ---------------------------------------------------------------- the classification ResNet


@pytest.mark.parametrize(
    "args,params,num_layers",
    [
        ({"layers": [1, 1, 1], "widths": [32, 64, 128], "stem": "small"}, 309994, 31),
        ({"block": "bottleneck", "layers": [1, 2, 1], "widths": [16, 32, 64], "stem": "small"}, 148090, 52),
    ],
)
def test_classification_resnet_is_unchanged(args, params, num_layers):
    """Counts measured before resnet_features was split out of ResNet."""
    model = ResNet(10, 32, **args)
    assert (model.count_params(), len(model.layers), model.name) == (params, num_layers, "resnet")


def test_resnet_features_gives_every_stage():
    inputs = keras.Input((64, 64, 3))
    features = resnet_features(inputs, "bottleneck", [1, 1, 1], [8, 16, 32], "imagenet")
    assert [tuple(f.shape[1:]) for f in features] == [(16, 16, 32), (8, 8, 64), (4, 4, 128)]
