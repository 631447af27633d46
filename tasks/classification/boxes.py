"""Random boxes in a DALI graph, one per sample: cutout's square and cutmix's pasted box.

A box is centred at a uniformly random pixel of an image of `side` x `side` pixels and clipped to the image (timm's
`rand_bbox`, DeVries and Taylor's cutout), so that near a border only its inner part remains. Its corners are
computed on the CPU, as argument inputs of fn.erase on either device.
"""

from __future__ import annotations

from dataclasses import dataclass

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types

ERASE_AXES = "HW"  # the axes the anchor and shape of a box are given in (fn.erase's axis_names)


@dataclass(frozen=True)
class Box:
    """A box per sample: `anchor` (top, left) and `shape` (height, width) as float DALI nodes (fn.erase's
    arguments), and its `area` in pixels (int32)."""

    anchor: object
    shape: object
    area: object


def _clipped_span(side: int, length):
    """(start, end) of a span of `length` pixels centred at a random pixel of 0..side-1, clipped to [0, side]."""
    centre = fn.random.uniform(values=list(range(side)), dtype=types.INT32)
    start = dmath.max(centre - length // 2, 0)
    end = dmath.min(centre + (length + 1) // 2, side)
    return start, end


def random_box(side: int, length) -> Box:
    """A `length` x `length` box (an int, or an int32 node per sample) at a random place of a side x side image,
    clipped to it."""
    top, bottom = _clipped_span(side, length)
    left, right = _clipped_span(side, length)
    height, width = bottom - top, right - left
    return Box(
        anchor=fn.cast(fn.stack(top, left), dtype=types.FLOAT),
        shape=fn.cast(fn.stack(height, width), dtype=types.FLOAT),
        area=height * width,
    )


def erase(images, box: Box, fill_value: float = 0.0):
    """`images` (layout HWC or CHW) with `box` set to `fill_value` in every channel."""
    return fn.erase(images, anchor=box.anchor, shape=box.shape, axis_names=ERASE_AXES, fill_value=fill_value)
