"""The torch SSD detector and its multibox loss: output layout and the anchor order contract, the
backbone's feature levels and their errors, the loss against an independent numpy reference (explicit
loops) and hand-computed cases, and that the model can fit a fixed batch."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
import torch

from hydrali.core.errors import HydraliError
from hydrali.tasks.classification.torch_model import ResNet, stage_strides
from hydrali.tasks.detection.anchors import default_boxes, encode, num_anchors_per_cell
from hydrali.tasks.detection.layout import BACKGROUND, BOX_VALUES, LABEL_COLUMN, TARGET_COLUMNS
from hydrali.tasks.detection.spec import DetectionLoss
from hydrali.tasks.detection.torch_loss import CLASS_LOSSES, MultiboxLoss, multibox_loss
from hydrali.tasks.detection.torch_model import SSD

LOSS_TOLERANCE = 1e-5
SMALL_ARGS = dict(block="basic", layers=[1, 1, 1, 1], widths=[32, 64, 128, 256], stem="imagenet")  # ssd_small-like
TINY_ARGS = dict(block="basic", layers=[1, 1, 1, 1], widths=[8, 16, 32, 64], stem="imagenet")
DEFAULT_ANCHORS = {"strides": [8, 16, 32], "min_scale": 0.1, "max_scale": 0.9, "aspect_ratios": [2.0]}


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _images(batch: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------
# the network


def test_output_shape_imagenet_stem():
    torch.manual_seed(0)
    model = SSD(num_classes=10, image_size=128, anchors=DEFAULT_ANCHORS, **SMALL_ARGS)
    raw = model(_images(2, 128))
    # levels 16x16, 8x8, 4x4 with 4 anchors per cell: (256 + 64 + 16) * 4 = 1344 anchors; 4 + 11 values each
    assert raw.shape == (2, 1344, 15)
    assert raw.dtype == torch.float32
    assert model.num_anchors == 1344 == len(default_boxes(model.anchor_spec))


def test_output_shape_small_stem_other_strides():
    torch.manual_seed(0)
    anchors = {"strides": [2, 4], "aspect_ratios": [2.0, 3.0]}
    model = SSD(
        num_classes=3,
        image_size=32,
        block="bottleneck",
        layers=[1, 1, 1],
        widths=[4, 8, 16],
        stem="small",
        anchors=anchors,
    )
    raw = model(_images(3, 32))
    # levels 16x16 and 8x8 with 2 + 2 * 2 = 6 anchors per cell: (256 + 64) * 6 = 1920
    assert raw.shape == (3, 1920, 4 + 4)
    assert model.level_stages == (1, 2)


def test_levels_follow_the_strides_order():
    torch.manual_seed(0)
    model = SSD(num_classes=2, image_size=64, anchors={"strides": [32, 8]}, **TINY_ARGS)
    assert model.level_stages == (3, 1)
    assert model.anchor_spec.feature_sizes == (2, 8)
    assert model(_images(1, 64)).shape == (1, (4 + 64) * 4, 4 + 3)


def _head_outputs(model: SSD, x: torch.Tensor) -> tuple[torch.Tensor, list, list]:
    """raw, and the loc / cls head outputs [B, A * k, f, f] of every level, caught by forward hooks."""
    locs, logits = [], []
    hooks = [h.register_forward_hook(lambda m, i, o: locs.append(o.detach())) for h in model.loc_heads]
    hooks += [h.register_forward_hook(lambda m, i, o: logits.append(o.detach())) for h in model.cls_heads]
    with torch.no_grad():
        raw = model(x)
    for hook in hooks:
        hook.remove()
    return raw, locs, logits


def test_anchor_order_contract():
    """Channel a * k + j at cell (y, x) of level l lands at row offset(l) + (y * f + x) * A + a."""
    torch.manual_seed(0)
    model = SSD(
        num_classes=2, image_size=64, anchors={"strides": [8, 16, 32], "aspect_ratios": [2.0, 3.0]}, **TINY_ARGS
    ).eval()
    for head in model.cls_heads:  # the class bias starts at zero: make every channel distinct
        torch.nn.init.normal_(head.bias)
    raw, locs, logits = _head_outputs(model, _images(2, 64))
    raw = raw.numpy()
    num_classes = 3
    offset = 0
    for level, f in enumerate(model.anchor_spec.feature_sizes):
        loc, logit = locs[level].numpy(), logits[level].numpy()
        per_cell = loc.shape[1] // 4
        assert loc.shape[2:] == (f, f) and per_cell == num_anchors_per_cell(model.anchor_spec)[level] == 6
        for b in range(raw.shape[0]):
            for y in range(f):
                for x in range(f):
                    for a in range(per_cell):
                        row = offset + (y * f + x) * per_cell + a
                        for j in range(4):
                            assert raw[b, row, j] == loc[b, a * 4 + j, y, x]
                        for c in range(num_classes):
                            assert raw[b, row, 4 + c] == logit[b, a * num_classes + c, y, x]
        offset += f * f * per_cell
    assert offset == raw.shape[1]


def test_anchor_order_with_a_marked_bias():
    """Only level 1's box head emits anything (its bias, value 100 * a + j): rows of that level read the
    bias of their anchor, every other row is zero."""
    torch.manual_seed(0)
    model = SSD(num_classes=1, image_size=64, anchors=DEFAULT_ANCHORS, **TINY_ARGS).eval()
    with torch.no_grad():
        for head in [*model.loc_heads, *model.cls_heads]:
            head.weight.zero_()
            head.bias.zero_()
        model.loc_heads[1].bias.copy_(torch.tensor([100.0 * a + j for a in range(4) for j in range(4)]))
        raw = model(_images(1, 64))[0]
    start, f = 8 * 8 * 4, 4  # level 0 is 8x8, level 1 is 4x4, 4 anchors per cell
    expected = torch.zeros_like(raw)
    for cell in range(f * f):
        for a in range(4):
            expected[start + cell * 4 + a, :4] = torch.tensor([100.0 * a + j for j in range(4)])
    torch.testing.assert_close(raw, expected, rtol=0, atol=0)


def test_class_head_bias_starts_at_zero():
    model = SSD(num_classes=4, image_size=64, anchors=DEFAULT_ANCHORS, **TINY_ARGS)
    for head in model.cls_heads:
        assert torch.count_nonzero(head.bias) == 0
    for head in model.loc_heads:
        assert torch.count_nonzero(head.bias) > 0


def test_parameters_are_the_used_backbone_and_the_heads():
    """No parameter past the last feature level (nor the classifier): the Keras model, built from its
    input to the levels, has exactly these."""
    num_classes, per_cell = 5, 4
    model = SSD(num_classes=num_classes, image_size=64, anchors={"strides": [4, 8]}, **SMALL_ARGS)
    resnet = ResNet(1, **SMALL_ARGS)
    backbone = sum(p.numel() for p in [*resnet.stem.parameters(), *resnet.stages[:2].parameters()])
    heads = sum(9 * cin * per_cell * k + per_cell * k for cin in (32, 64) for k in (4, num_classes + 1))
    assert sum(p.numel() for p in model.parameters()) == backbone + heads
    assert len(model.backbone.stages) == 2


@pytest.mark.parametrize(
    "stem, strides, offered",
    [
        ("imagenet", [8, 16, 64], "[4, 8, 16, 32]"),
        ("imagenet", [2, 8], "[4, 8, 16, 32]"),
        ("small", [2, 16], "[1, 2, 4, 8]"),
    ],
)
def test_a_stride_no_stage_has_is_refused(stem, strides, offered):
    with pytest.raises(ValueError, match=r"model\.anchors\.strides") as error:
        SSD(
            num_classes=2,
            image_size=128,
            block="basic",
            layers=[1, 1, 1, 1],
            widths=[8, 8, 8, 8],
            stem=stem,
            anchors={"strides": strides},
        )
    assert offered in str(error.value)


def test_image_size_not_divisible_is_refused():
    with pytest.raises(ValueError, match="multiple"):
        SSD(num_classes=2, image_size=100, anchors=DEFAULT_ANCHORS, **TINY_ARGS)


def test_wrong_input_size_is_refused():
    model = SSD(num_classes=2, image_size=64, anchors=DEFAULT_ANCHORS, **TINY_ARGS)
    with pytest.raises(ValueError, match="64x64"):
        model(_images(1, 96))


def test_resnet_features():
    torch.manual_seed(0)
    model = ResNet(7, block="bottleneck", layers=[1, 1, 1], widths=[4, 8, 16], stem="imagenet").eval()
    x = _images(2, 64)
    with torch.no_grad():
        features = model.features(x)
        logits = model(x)
        assert [tuple(f.shape) for f in features] == [(2, 16, 16, 16), (2, 32, 8, 8), (2, 64, 4, 4)]
        torch.testing.assert_close(model.head(features[-1]), logits)
    assert model.stage_strides() == (4, 8, 16) == stage_strides("imagenet", 3)
    assert model.stage_channels() == (16, 32, 64)
    assert stage_strides("small", 4) == (1, 2, 4, 8)


# ----------------------------------------------------------------------------------------------
# the loss: an independent numpy reference


def _smooth_l1(d: float) -> float:
    return 0.5 * d * d if abs(d) < 1 else abs(d) - 0.5


def reference_loss(
    raw: np.ndarray, targets: np.ndarray, kind: str, neg_pos_ratio: float = 3.0, alpha: float = 0.25, gamma: float = 2.0
) -> np.ndarray:
    """Per-image multibox loss, written from the spec with loops, in float64."""
    raw, targets = raw.astype(np.float64), targets.astype(np.float64)
    losses = []
    for b in range(raw.shape[0]):
        labels = [int(round(v)) for v in targets[b, :, LABEL_COLUMN]]
        positive = [label > BACKGROUND for label in labels]
        num_pos = sum(positive)
        loc, ce, focal = 0.0, [], 0.0
        for n, label in enumerate(labels):
            logits = raw[b, n, BOX_VALUES:]
            top = max(logits)
            log_p = logits[label] - (top + math.log(sum(math.exp(v - top) for v in logits)))
            ce.append(-log_p)
            alpha_t = alpha if positive[n] else 1 - alpha
            focal += -alpha_t * (1 - math.exp(log_p)) ** gamma * log_p
            if positive[n]:
                loc += sum(_smooth_l1(raw[b, n, j] - targets[b, n, j]) for j in range(BOX_VALUES))
        if kind == "focal":
            conf = focal
        else:
            k = min(math.floor(neg_pos_ratio * num_pos), len(labels) - num_pos)
            negatives = sorted((c for c, p in zip(ce, positive) if not p), reverse=True)
            conf = sum(c for c, p in zip(ce, positive) if p) + sum(negatives[:k])
        losses.append((loc + conf) / max(num_pos, 1))
    return np.asarray(losses)


NUM_POSITIVES = (0, 3, 20, 24)  # per image, of N = 24: none; k = 9; k capped by N - num_pos = 4; k = 0


def _random_batch(seed: int, num_anchors: int = 24, num_classes: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """raw [B, N, 4 + C] and targets [B, N, 5] with NUM_POSITIVES positives per image, labels slightly off
    integers (they are rounded)."""
    rng = np.random.default_rng(seed)
    batch = len(NUM_POSITIVES)
    raw = (rng.standard_normal((batch, num_anchors, BOX_VALUES + num_classes)) * 2).astype(np.float32)
    targets = np.zeros((batch, num_anchors, TARGET_COLUMNS), dtype=np.float32)
    labels = targets[..., LABEL_COLUMN]  # a view
    for b, num_pos in enumerate(NUM_POSITIVES):
        chosen = rng.permutation(num_anchors)[:num_pos]
        targets[b, chosen, :BOX_VALUES] = rng.standard_normal((num_pos, BOX_VALUES)) * 1.5
        labels[b, chosen] = rng.integers(1, num_classes, num_pos) + rng.uniform(-0.2, 0.2, num_pos)
    labels += np.where(labels == BACKGROUND, rng.uniform(-0.2, 0.2, labels.shape), 0)
    return raw, targets


@pytest.mark.parametrize(
    "kind, kwargs",
    [
        ("hard_negatives", {}),
        ("hard_negatives", {"neg_pos_ratio": 1.5}),
        ("hard_negatives", {"neg_pos_ratio": 0.0}),
        ("focal", {}),
        ("focal", {"focal_alpha": 0.5, "focal_gamma": 1.0}),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_matches_the_numpy_reference(kind, kwargs, seed):
    raw, targets = _random_batch(seed)
    got = multibox_loss(torch.from_numpy(raw), torch.from_numpy(targets), kind=kind, **kwargs)
    ref_args = {
        "neg_pos_ratio": kwargs.get("neg_pos_ratio", 3.0),
        "alpha": kwargs.get("focal_alpha", 0.25),
        "gamma": kwargs.get("focal_gamma", 2.0),
    }
    expected = reference_loss(raw, targets, kind, **ref_args)
    assert got.shape == (len(NUM_POSITIVES),) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), expected, rtol=LOSS_TOLERANCE, atol=LOSS_TOLERANCE)


def test_the_reference_batch_covers_the_edge_cases():
    """Guards the batch above: its images must keep exercising the edge cases they are there for."""
    _, targets = _random_batch(0)
    num_pos = (np.round(targets[..., LABEL_COLUMN]) > BACKGROUND).sum(axis=1)
    assert tuple(num_pos) == NUM_POSITIVES
    assert 3 * num_pos[2] > targets.shape[1] - num_pos[2]  # k capped by N - num_pos


# ----------------------------------------------------------------------------------------------
# the loss: hand-computed cases


def _tiny_case() -> tuple[torch.Tensor, torch.Tensor]:
    """N = 4 anchors, C = 2: anchor 0 positive (label 1, logits [5, 0]: ce = log(1 + e^5), the largest),
    anchors 1..3 background with logits [0, t], t = -1, 2, 1: ce = log(1 + e^t). Box offsets: the
    positive is off by (0.5, 2, -3, 0) -> smooth L1 0.125 + 1.5 + 2.5 + 0 = 4.125; the negatives' box
    outputs are far off and must not count."""
    raw = torch.tensor(
        [
            [
                [0.5, 2.0, -3.0, 0.0, 5.0, 0.0],
                [9.0, 9.0, 9.0, 9.0, 0.0, -1.0],
                [9.0, 9.0, 9.0, 9.0, 0.0, 2.0],
                [9.0, 9.0, 9.0, 9.0, 0.0, 1.0],
            ]
        ]
    )
    targets = torch.tensor(
        [[[0.0, 0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]]]
    )
    return raw, targets


def _softplus(t: float) -> float:
    return math.log(1 + math.exp(t))


@pytest.mark.parametrize(
    "neg_pos_ratio, negatives",
    [
        (0.5, []),  # k = floor(0.5) = 0
        (1.0, [2.0]),  # k = 1: the hardest negative (t = 2)
        (2.9, [2.0, 1.0]),  # k = floor(2.9) = 2
        (3.0, [2.0, 1.0, -1.0]),  # k = 3 = N - num_pos
        (10.0, [2.0, 1.0, -1.0]),  # k = min(10, 3)
    ],
)
def test_hard_negative_selection_by_hand(neg_pos_ratio, negatives):
    raw, targets = _tiny_case()
    expected = 4.125 + _softplus(5.0) + sum(_softplus(t) for t in negatives)
    got = multibox_loss(raw, targets, neg_pos_ratio=neg_pos_ratio)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_hard_negatives_unselected_get_no_gradient():
    raw, targets = _tiny_case()
    raw.requires_grad_(True)
    multibox_loss(raw, targets, neg_pos_ratio=2.0).sum().backward()
    assert torch.count_nonzero(raw.grad[0, 1]) == 0  # t = -1: the easiest negative, not mined
    assert torch.count_nonzero(raw.grad[0, 2:, 4:]) == 4  # the two mined negatives' logits
    assert torch.count_nonzero(raw.grad[0, 1:, :4]) == 0  # no box loss on negatives
    assert torch.count_nonzero(raw.grad[0, 0]) == 5  # the positive: 3 nonzero offsets + 2 logits


def test_k_is_computed_in_float32_as_on_keras():
    """k = floor(neg_pos_ratio * num_pos) in float32: 2.1 * 30 gives 62 (63 in float64)."""
    num_anchors, num_pos = 100, 30
    raw = torch.zeros(1, num_anchors, 4 + 2)
    raw[0, num_pos:, 5] = torch.arange(num_anchors - num_pos, 0, -1, dtype=torch.float32)  # hardest first
    targets = torch.zeros(1, num_anchors, 5)
    targets[0, :num_pos, 4] = 1.0
    ce = torch.nn.functional.softplus(raw[0, :, 5] - raw[0, :, 4])  # label 0 ce; label 1: log 2
    expected = (num_pos * math.log(2) + ce[num_pos : num_pos + 62].sum().item()) / num_pos
    assert multibox_loss(raw, targets, neg_pos_ratio=2.1).item() == pytest.approx(expected, rel=1e-6)


def test_focal_by_hand():
    """Two anchors, logits [0, 0] (p_t = 1/2): positive term 0.25 * 0.25 * log 2, background term
    0.75 * 0.25 * log 2; plus the positive's smooth L1 4.125; one positive."""
    raw = torch.tensor([[[0.5, 2.0, -3.0, 0.0, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0, 0.0, 0.0]]])
    targets = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]]])
    got = multibox_loss(raw, targets, kind="focal")
    assert got.item() == pytest.approx(4.125 + 0.25 * math.log(2), rel=1e-6)


def test_zero_positives():
    """No positive: hard negatives mines nothing (loss 0); focal sums the background terms (divided by 1)."""
    raw = torch.tensor([[[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]] * 3])
    targets = torch.zeros(1, 3, 5)
    assert multibox_loss(raw, targets).item() == 0.0
    expected = 3 * 0.75 * (2 / 3) ** 2 * math.log(3)
    assert multibox_loss(raw, targets, kind="focal").item() == pytest.approx(expected, rel=1e-6)


def test_loss_module_and_dtypes():
    raw, targets = _random_batch(2)
    raw, targets = torch.from_numpy(raw), torch.from_numpy(targets)
    module = MultiboxLoss("focal", focal_alpha=0.3, focal_gamma=1.5)
    per_image = multibox_loss(raw, targets, kind="focal", focal_alpha=0.3, focal_gamma=1.5)
    torch.testing.assert_close(module.per_image(raw, targets), per_image)
    torch.testing.assert_close(module(raw, targets), per_image.mean())
    half = multibox_loss(raw.to(torch.bfloat16), targets)
    assert half.dtype == torch.float32


def test_the_loss_computes_exactly_the_schemas_kinds_each_its_own_way():
    """task.loss's choices (the schema's DetectionLoss) are the kinds the loss's table holds; each is taken as the
    config passes it (a string) and gives its own values."""
    assert set(CLASS_LOSSES) == set(DetectionLoss)
    raw, targets = _random_batch(0)
    losses = {
        kind.value: multibox_loss(torch.from_numpy(raw), torch.from_numpy(targets), kind=kind.value)
        for kind in DetectionLoss
    }
    assert all(not torch.equal(a, b) for a, b in itertools.combinations(losses.values(), 2)), losses


def test_unknown_kind_and_bad_shapes_are_refused():
    raw, targets = _tiny_case()
    refusal = f"task.loss='ohem': choose one of {', '.join(DetectionLoss.values())}"
    with pytest.raises(HydraliError, match=re.escape(refusal)):
        multibox_loss(raw, targets, kind="ohem")
    with pytest.raises(HydraliError, match=re.escape(refusal)):
        MultiboxLoss("ohem")
    with pytest.raises(ValueError, match="targets"):
        multibox_loss(raw, targets[..., :4])


# ----------------------------------------------------------------------------------------------
# training


SYNTHETIC_BOXES = [np.array([[0.05, 0.05, 0.2, 0.2], [0.3, 0.3, 1.0, 1.0]]), np.array([[0.1, 0.5, 0.45, 0.9]])]
SYNTHETIC_LABELS = [np.array([1, 2]), np.array([1])]


def _synthetic_batch(model: SSD) -> tuple[torch.Tensor, torch.Tensor]:
    """Two images, bright rectangles (channel = class) on a dark background: a small and a large box in
    the first, a medium one in the second (positives on every level of a 64 px, strides 8/16/32 model),
    and their targets, encoded against the model's anchors."""
    size = model.image_size
    anchors = default_boxes(model.anchor_spec)
    images = torch.full((len(SYNTHETIC_BOXES), 3, size, size), -1.0)
    targets = []
    for i, (boxes, labels) in enumerate(zip(SYNTHETIC_BOXES, SYNTHETIC_LABELS)):
        for box, label in zip(boxes, labels):
            left, top, right, bottom = (box * size).astype(int)
            images[i, label, top:bottom, left:right] = 1.0
        loc, cls = encode(boxes, labels, anchors)
        targets.append(np.concatenate([loc, cls[:, None].astype(np.float32)], axis=1))
    return images, torch.from_numpy(np.stack(targets))


def test_the_synthetic_batch_has_positives_on_every_level():
    model = SSD(num_classes=2, image_size=64, anchors=DEFAULT_ANCHORS, **TINY_ARGS)
    _, targets = _synthetic_batch(model)
    positive_rows = torch.nonzero(targets[..., 4] > 0)[:, 1]
    level_ends = torch.tensor([8 * 8 * 4, (64 + 16) * 4, (64 + 16 + 4) * 4])
    assert set(torch.bucketize(positive_rows, level_ends, right=True).tolist()) == {0, 1, 2}


@pytest.mark.parametrize("kind", ["hard_negatives", "focal"])
def test_a_few_steps_fit_a_fixed_batch(kind):
    torch.manual_seed(0)
    model = SSD(num_classes=2, image_size=64, anchors=DEFAULT_ANCHORS, **TINY_ARGS)
    images, targets = _synthetic_batch(model)
    loss_fn = MultiboxLoss(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = loss_fn(model(images), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.5 * losses[0], losses


def test_gradients_reach_both_heads_and_the_backbone():
    torch.manual_seed(0)
    model = SSD(num_classes=2, image_size=64, anchors=DEFAULT_ANCHORS, **TINY_ARGS)
    images, targets = _synthetic_batch(model)
    MultiboxLoss()(model(images), targets).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, f"{name} is unused"
    for head in [*model.loc_heads, *model.cls_heads]:
        assert torch.count_nonzero(head.weight.grad) > 0 and torch.count_nonzero(head.bias.grad) > 0
    assert torch.count_nonzero(model.backbone.stem[0].weight.grad) > 0
