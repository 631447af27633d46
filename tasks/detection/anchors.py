"""SSD default boxes (anchors) and the box coding of DALI's `fn.box_encoder`, in numpy only.

One definition for the DALI recipe (which encodes the ground truth with `fn.box_encoder`), the torch
model and the Keras model (which emit one prediction per anchor and decode them): they agree by
construction because they all import this module.

Anchor order (the contract every head follows)
----------------------------------------------
`default_boxes(spec)` returns anchors level by level (in `spec.feature_sizes` order); within a level,
row-major over the grid (row y, then column x); within a cell, the anchors of that cell in the
order of `cell_anchor_sizes` (square of scale s_k, square of sqrt(s_k * s_k+1), then for each aspect
ratio r the wide box (w > h) and the tall box (w < h)). So anchor index

    offset(level) + (y * f + x) * A + a        with f = feature_sizes[level], A = anchors per cell,

where offset(level) is the number of anchors of all earlier levels. A head with A anchors per cell
and C outputs per anchor (4 box offsets, or 1 + K class logits) emits, per level, C * A channels
with channel index `a * C + c` (anchor-major, value-minor). Then:

    torch (NCHW): out.permute(0, 2, 3, 1).reshape(B, f * f * A, C)
    Keras (NHWC): keras.ops.reshape(out, (B, f * f * A, C))

and the levels are concatenated along axis 1 in `spec.feature_sizes` order.

Box coding (what `fn.box_encoder(**box_encoder_args(anchors))` emits, per image)
--------------------------------------------------------------------------------
Read from DALI's source (dali/operators/ssd/box_encoder.cc, CPU; box_encoder.cu, GPU) and checked
against DALI's output in tests/test_detection_anchors.py:

- Matching. IoU of every ground-truth box with every anchor; each box's best anchor (the last
  index on ties) gets IoU 2, so every box is matched at least once; each anchor takes the box
  with its highest IoU (the last box on ties) and is matched when that IoU > MATCH_IOU (strict).
- loc [N, 4] float32 is NOT ltrb (DALI's docstring says ltrb; its code does not): for a matched
  anchor it is the offset of the box in centre/size form, divided by the stds:
      ((bcx - acx) / aw / 0.1,  (bcy - acy) / ah / 0.1,  log(bw / aw) / 0.2,  log(bh / ah) / 0.2)
  where (acx, acy, aw, ah) is the anchor *as passed* (the clipped ltrb box) in centre/size form.
- Unmatched anchors: loc = 0 (all four values) and label 0 (layout.BACKGROUND).
- cls [N] int32: the matched box's label (the recipe's labels must be 1..K; 0 means background).
- `scale` multiplies boxes and anchors before the offsets are taken; it cancels out exactly in the
  formulas above, so BOX_ENCODER_SCALE = 1 (boxes normalized); other values change only rounding.
- Pitfall: a box of zero width or height overlaps no anchor, so every IoU ties at 0 and it is
  forced onto the LAST anchor, with offsets log(0) = -inf (and it takes that anchor from any real
  box listed before it). Drop such boxes before the encoder, and pad ground truth (fn.pad) only
  after it: zero padding boxes would do the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from hydrali.tasks.detection.layout import BACKGROUND, BOX_VALUES

BOX_ENCODER_STDS = (0.1, 0.1, 0.2, 0.2)  # (centre x, centre y, width, height): the usual SSD variances
BOX_ENCODER_MEANS = (0.0, 0.0, 0.0, 0.0)  # DALI's default: no mean is subtracted
BOX_ENCODER_SCALE = 1.0  # boxes and anchors are normalized to [0, 1]; scale cancels out (see above)
MATCH_IOU = 0.5  # an anchor is matched to a box when their IoU exceeds this (DALI's `criteria`)

FORCED_MATCH_IOU = 2.0  # DALI's marker for each box's best anchor (above any real IoU)
DEFAULT_STRIDES = (8, 16, 32)
DEFAULT_MIN_SCALE = 0.1
DEFAULT_MAX_SCALE = 0.9
DEFAULT_ASPECT_RATIO = 2.0
ANCHOR_KEYS = frozenset({"strides", "min_scale", "max_scale", "aspect_ratios"})  # a model config's `anchors` node
CELL_CENTRE = 0.5  # anchors sit at the centre of their grid cell: ((x + 0.5) / f, (y + 0.5) / f)


@dataclass(frozen=True)
class AnchorSpec:
    """The default boxes of an SSD-style detector on a square image.

    image_size: the input side in pixels (square inputs).
    feature_sizes: the side of each level's square feature grid, finest first, e.g. (16, 8, 4)
        for a 128 px input with strides 8, 16, 32.
    scales: one more value than there are levels, increasing, in (0, 1]: level k's anchors have
        side scales[k] (relative to the image); its "extra" square anchor has side
        sqrt(scales[k] * scales[k + 1]); so the last value is used only for the last level's extra
        anchor.
    aspect_ratios: per level, the ratios r >= 1 (width / height); each adds two anchors per cell
        of area scales[k]**2: a wide one (r) and a tall one (1 / r).
    """

    image_size: int
    feature_sizes: tuple[int, ...]
    scales: tuple[float, ...]
    aspect_ratios: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_sizes", tuple(int(f) for f in self.feature_sizes))
        object.__setattr__(self, "scales", tuple(float(s) for s in self.scales))
        object.__setattr__(self, "aspect_ratios", tuple(tuple(float(r) for r in rs) for rs in self.aspect_ratios))
        _check_spec(self)

    @property
    def num_levels(self) -> int:
        """The number of feature levels."""
        return len(self.feature_sizes)


def _check_spec(spec: AnchorSpec) -> None:
    levels = len(spec.feature_sizes)
    if spec.image_size <= 0 or levels == 0 or min(spec.feature_sizes) <= 0:
        raise ValueError(
            f"AnchorSpec: image_size ({spec.image_size}) and feature_sizes {spec.feature_sizes} "
            "must be positive, with at least one level"
        )
    if len(spec.scales) != levels + 1:
        raise ValueError(
            f"AnchorSpec: scales needs {levels + 1} values (one per level, plus one for the last "
            f"level's extra anchor), got {len(spec.scales)}: {spec.scales}"
        )
    if not all(0 < a < b for a, b in zip(spec.scales, spec.scales[1:])) or spec.scales[-1] > 1:
        raise ValueError(f"AnchorSpec: scales must increase within (0, 1], got {spec.scales}")
    if len(spec.aspect_ratios) != levels:
        raise ValueError(
            f"AnchorSpec: aspect_ratios needs one tuple per level ({levels}), "
            f"got {len(spec.aspect_ratios)}: {spec.aspect_ratios}"
        )
    if any(r < 1 for rs in spec.aspect_ratios for r in rs):
        raise ValueError(
            f"AnchorSpec: aspect ratios are width/height >= 1 (each also adds its inverse), got {spec.aspect_ratios}"
        )


def spec_for(
    image_size: int,
    strides: tuple[int, ...] = DEFAULT_STRIDES,
    *,
    min_scale: float = DEFAULT_MIN_SCALE,
    max_scale: float = DEFAULT_MAX_SCALE,
    aspect_ratios: tuple[tuple[float, ...], ...] | None = None,
) -> AnchorSpec:
    """The AnchorSpec of a backbone with these strides: feature sizes image_size / stride, scales
    evenly spaced from min_scale to max_scale (one more than levels), and by default one aspect
    ratio (2, hence also 1/2) per level: 4 anchors per cell."""
    bad = [s for s in strides if s <= 0 or image_size % s]
    if bad:
        raise ValueError(
            f"image size {image_size} is not a multiple of the strides {bad}: "
            "choose data.image_size divisible by every stride"
        )
    levels = len(strides)
    scales = tuple(float(s) for s in np.linspace(min_scale, max_scale, levels + 1))
    ratios = aspect_ratios if aspect_ratios is not None else ((DEFAULT_ASPECT_RATIO,),) * levels
    return AnchorSpec(image_size, tuple(image_size // s for s in strides), scales, tuple(ratios))


def anchor_spec(image_size: int, anchors: Mapping) -> AnchorSpec:
    """The AnchorSpec of a model config's `anchors` node (strides, min_scale, max_scale, aspect_ratios: one
    list applied to every level): the one call the recipe's encoder and both models' heads make."""
    unknown = sorted(set(anchors) - ANCHOR_KEYS)
    if unknown:
        raise ValueError(
            f"model.anchors.{unknown[0]} is not an anchor setting: they are {', '.join(sorted(ANCHOR_KEYS))}"
        )
    strides = tuple(int(s) for s in anchors["strides"])
    ratios = tuple(float(r) for r in anchors.get("aspect_ratios", (DEFAULT_ASPECT_RATIO,)))
    return spec_for(
        int(image_size),
        strides,
        min_scale=float(anchors.get("min_scale", DEFAULT_MIN_SCALE)),
        max_scale=float(anchors.get("max_scale", DEFAULT_MAX_SCALE)),
        aspect_ratios=(ratios,) * len(strides),
    )


def cell_anchor_sizes(spec: AnchorSpec, level: int) -> np.ndarray:
    """[A, 2] (width, height) of the anchors of one cell of `level`, relative to the image, in
    their order within the cell: square s_k, square sqrt(s_k * s_k+1), then wide and tall per ratio."""
    s, s_next = spec.scales[level], spec.scales[level + 1]
    sizes = [(s, s), (np.sqrt(s * s_next),) * 2]
    for r in spec.aspect_ratios[level]:
        sizes += [(s * np.sqrt(r), s / np.sqrt(r)), (s / np.sqrt(r), s * np.sqrt(r))]
    return np.asarray(sizes, dtype=np.float64)


def num_anchors_per_cell(spec: AnchorSpec) -> tuple[int, ...]:
    """Anchors per grid cell, per level (the head's A: it emits A * 4 box and A * (1 + K) class channels)."""
    return tuple(2 + 2 * len(rs) for rs in spec.aspect_ratios)


def num_anchors(spec: AnchorSpec) -> int:
    """The total number of anchors N: sum over levels of f * f * A."""
    return sum(f * f * a for f, a in zip(spec.feature_sizes, num_anchors_per_cell(spec)))


def _level_boxes(spec: AnchorSpec, level: int) -> np.ndarray:
    f = spec.feature_sizes[level]
    sizes = cell_anchor_sizes(spec, level)  # [A, 2]
    centres = (np.arange(f, dtype=np.float64) + CELL_CENTRE) / f
    cy, cx = np.meshgrid(centres, centres, indexing="ij")  # [f, f]: row y, column x
    cxy = np.stack([cx, cy], axis=-1).reshape(f * f, 1, 2)  # row-major cells
    half = sizes[None, :, :] / 2  # [1, A, 2]
    return np.concatenate([cxy - half, cxy + half], axis=-1).reshape(-1, BOX_VALUES)


def default_boxes(spec: AnchorSpec) -> np.ndarray:
    """[N, 4] float32 anchors, ltrb normalized to [0, 1] (clipped), in the documented order
    (level, row y, column x, anchor in cell). These exact values go to fn.box_encoder and to decode."""
    boxes = np.concatenate([_level_boxes(spec, level) for level in range(spec.num_levels)])
    return np.clip(boxes, 0.0, 1.0).astype(np.float32)


def box_encoder_args(anchors: np.ndarray) -> dict:
    """The keyword arguments of `fn.box_encoder(boxes, labels, **box_encoder_args(anchors))`, so that
    the recipe encodes exactly what `decode` (numpy) and `decode_boxes` (torch) invert."""
    return {
        "anchors": np.asarray(anchors, dtype=np.float32).reshape(-1).tolist(),
        "criteria": MATCH_IOU,
        "offset": True,
        "stds": list(BOX_ENCODER_STDS),
        "means": list(BOX_ENCODER_MEANS),
        "scale": BOX_ENCODER_SCALE,
    }


def to_centre_size(boxes_ltrb: np.ndarray) -> np.ndarray:
    """[..., 4] ltrb -> [..., 4] (centre x, centre y, width, height)."""
    lt, rb = boxes_ltrb[..., :2], boxes_ltrb[..., 2:]
    return np.concatenate([0.5 * (lt + rb), rb - lt], axis=-1)


def to_ltrb(boxes_cxcywh: np.ndarray) -> np.ndarray:
    """[..., 4] (centre x, centre y, width, height) -> [..., 4] ltrb."""
    centre, half = boxes_cxcywh[..., :2], 0.5 * boxes_cxcywh[..., 2:]
    return np.concatenate([centre - half, centre + half], axis=-1)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[M, N] IoU of ltrb boxes a [M, 4] with b [N, 4], in a's dtype (0 where boxes do not overlap,
    as DALI counts them: touching boxes overlap nothing)."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    overlapping = np.all(rb > lt, axis=-1)
    inter = np.where(overlapping, (rb[..., 0] - lt[..., 0]) * (rb[..., 1] - lt[..., 1]), 0)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inter > 0, inter / union, 0).astype(a.dtype)


def _last_argmax(values: np.ndarray, axis: int) -> np.ndarray:
    """Index of the maximum along `axis`, the last one on ties (as DALI's `>=` scans pick)."""
    flipped = np.flip(values, axis=axis)
    return values.shape[axis] - 1 - np.argmax(flipped, axis=axis)


def match_anchors(boxes_ltrb: np.ndarray, anchors: np.ndarray, iou_threshold: float = MATCH_IOU) -> np.ndarray:
    """[N] index of the box each anchor is matched to, -1 where none: DALI box_encoder's matching
    (every box keeps its best anchor; otherwise IoU > iou_threshold)."""
    if len(boxes_ltrb) == 0:
        return np.full(len(anchors), -1, dtype=np.int64)
    ious = iou_matrix(boxes_ltrb.astype(np.float32), anchors.astype(np.float32))  # [M, N]
    ious[np.arange(len(boxes_ltrb)), _last_argmax(ious, axis=1)] = FORCED_MATCH_IOU
    best_box = _last_argmax(ious, axis=0)
    matched = ious[best_box, np.arange(len(anchors))] > iou_threshold
    return np.where(matched, best_box, -1)


def _offsets(boxes_ltrb: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    box, anchor = to_centre_size(boxes_ltrb.astype(np.float64)), to_centre_size(anchors.astype(np.float64))
    stds, means = np.asarray(BOX_ENCODER_STDS), np.asarray(BOX_ENCODER_MEANS)
    with np.errstate(divide="ignore"):
        raw = np.concatenate([(box[:, :2] - anchor[:, :2]) / anchor[:, 2:], np.log(box[:, 2:] / anchor[:, 2:])], axis=1)
    return (raw - means) / stds


def encode(
    boxes_ltrb: np.ndarray, labels: np.ndarray, anchors: np.ndarray, iou_threshold: float = MATCH_IOU
) -> tuple[np.ndarray, np.ndarray]:
    """(loc [N, 4] float32, cls [N] int32) for one image's ground truth (boxes [M, 4] ltrb normalized,
    labels [M] in 1..K): the reference of what fn.box_encoder(**box_encoder_args(anchors)) emits."""
    boxes_ltrb = np.asarray(boxes_ltrb, dtype=np.float32).reshape(-1, BOX_VALUES)
    labels = np.asarray(labels).reshape(-1)
    match = match_anchors(boxes_ltrb, anchors, iou_threshold)
    matched = match >= 0
    loc = np.zeros((len(anchors), BOX_VALUES), dtype=np.float32)
    cls = np.full(len(anchors), BACKGROUND, dtype=np.int32)
    loc[matched] = _offsets(boxes_ltrb[match[matched]], anchors[matched])
    cls[matched] = labels[match[matched]]
    return loc, cls


def decode(loc: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """[..., N, 4] ltrb boxes (normalized, not clipped) from box offsets loc [..., N, 4] as `encode`
    and fn.box_encoder emit them, relative to anchors [N, 4] ltrb: the inverse of `encode`."""
    anchor = to_centre_size(np.asarray(anchors, dtype=np.float32))
    stds, means = np.asarray(BOX_ENCODER_STDS, np.float32), np.asarray(BOX_ENCODER_MEANS, np.float32)
    raw = np.asarray(loc, dtype=np.float32) * stds + means
    centre = anchor[:, :2] + raw[..., :2] * anchor[:, 2:]
    size = anchor[:, 2:] * np.exp(raw[..., 2:])
    return to_ltrb(np.concatenate([centre, size], axis=-1))
