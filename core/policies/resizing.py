"""Progressive resizing (progressive_resizing), decided once for every backend: the first epochs train on the
pipeline's images scaled down, the side growing to data.image_size (FFCV's and Composer's technique: early epochs,
which learn coarse features, cost a fraction of a full-size epoch). Validation, eval, predict and export always see
data.image_size.

The side of epoch e (0-based) of E, from start side s to full side S, reaching S at epoch R = floor(full_at x E +
0.5), at most E - 1 (the last epoch is always at S): s + (S - s) x e / R rounded down to a multiple of `multiple`
(never below s) while e < R, then S. Each backend
scales a training batch to its epoch's side by the same matrices, made here (resampling_matrix): bilinear with
antialiasing, the filter of PIL's, torch's F.interpolate(antialias=True) and TensorFlow's
tf.image.resize(antialias=True), applied as two matrix products (rows, then columns), which XLA and torch.compile
take (TensorFlow's own antialiased resize is an op XLA cannot compile).
"""

from __future__ import annotations

import math

import numpy as np
from omegaconf import DictConfig

from hydrali.core.contracts.registry import task_specs
from hydrali.core.errors import HydraliError


def training_sizes(setting: DictConfig | None, epochs: int, image_size: int) -> tuple[int, ...]:
    """The side of the training images in each epoch (one per epoch, the first epoch's first); () when
    progressive_resizing.start_side is null (every epoch at image_size)."""
    if setting is None or setting.get("start_side") is None:
        return ()
    start, full_at, multiple = int(setting.start_side), float(setting.full_at), int(setting.multiple)
    ramp = min(max(1, math.floor(full_at * epochs + 0.5)), max(1, epochs - 1))  # the first epoch at image_size
    sides = []
    for epoch in range(epochs):
        if epoch >= ramp:
            sides.append(image_size)
            continue
        grown = start + (image_size - start) * epoch / ramp
        sides.append(max(start, math.floor(grown / multiple) * multiple))
    return tuple(sides)


def check(cfg: DictConfig) -> None:
    """progressive_resizing's settings fit the run: a start side below data.image_size, a fraction of the epochs in
    (0, 1], a multiple of at least 1, a task whose batches can be scaled; else one line naming the option."""
    setting = cfg.get("progressive_resizing")
    if setting is None or setting.get("start_side") is None:
        return
    start, image_size = int(setting.start_side), int(cfg.data.image_size)
    if not 0 < start < image_size:
        raise HydraliError(
            f"progressive_resizing.start_side={start}: pass a side in 1..{image_size - 1} (below "
            f"data.image_size={image_size}), or null (off)"
        )
    if not 0 < float(setting.full_at) <= 1:
        raise HydraliError(
            f"progressive_resizing.full_at={setting.full_at}: pass a fraction of the epochs in (0, 1] (the point "
            f"from which training is at data.image_size)"
        )
    if int(setting.multiple) < 1:
        raise HydraliError(f"progressive_resizing.multiple={setting.multiple}: pass 1 or more (pixels)")
    able = [name for name, spec in task_specs().items() if spec.trains_scaled_down]
    if str(cfg.task.name) not in able:
        raise HydraliError(
            f"progressive_resizing.start_side={start}: task={cfg.task.name} cannot train on scaled-down batches "
            f"(only {', '.join(able)}): pass progressive_resizing.start_side=null"
        )


def describe(sides: tuple[int, ...]) -> str:
    """The sides by epoch, for the log: "8 px (epochs 1-2), 12 px (epoch 3), 16 px (epochs 4-5)"."""
    parts, first = [], 0
    for epoch in range(1, len(sides) + 1):
        if epoch == len(sides) or sides[epoch] != sides[first]:
            span = f"epoch {first + 1}" if epoch == first + 1 else f"epochs {first + 1}-{epoch}"
            parts.append(f"{sides[first]} px ({span})")
            first = epoch
    return ", ".join(parts)


def resampling_matrix(source: int, side: int) -> np.ndarray:
    """The (side, source) matrix that takes `source` samples along one axis to `side` by bilinear interpolation with
    antialiasing (side < source): output i is the mean of the inputs under a triangle of half-width source / side
    centred at (i + 0.5) x source / side, its weights renormalized where it reaches past the edge."""
    scale = source / side
    support = max(scale, 1.0)  # the triangle's half-width, in input samples
    matrix = np.zeros((side, source), dtype=np.float64)
    for i in range(side):
        centre = (i + 0.5) * scale
        first, last = max(int(centre - support + 0.5), 0), min(int(centre + support + 0.5), source)
        taps = np.arange(first, last)
        weights = np.maximum(0.0, 1.0 - np.abs((taps - centre + 0.5) / support))
        matrix[i, first:last] = weights / weights.sum()
    return matrix.astype(np.float32)
