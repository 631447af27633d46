"""Checks of network layouts that both frameworks' builders share (no framework imported here)."""

from __future__ import annotations

from typing import Sequence

from hydrali.core.errors import HydraliError


def check_resnet9(widths: Sequence[int], layers: Sequence[int]) -> None:
    """Fail, naming the options, unless `widths` has one entry more than `layers` (the first convolution's, then
    each stage's) and every stage has zero or more residual pairs."""
    if len(widths) != len(layers) + 1:
        raise HydraliError(
            f"model.widths ({len(widths)} entries) must have one more than model.layers ({len(layers)} stages): "
            "the first convolution's channels, then each stage's"
        )
    if any(depth < 0 for depth in layers):
        raise HydraliError(f"model.layers={list(layers)}: each stage's residual pairs are 0 or more")


def resnet9_smallest_side(layers: Sequence[int]) -> int:
    """The smallest image side ResNet-9 with these stages takes: each stage's 2x2 max-pool halves it."""
    return 2 ** len(layers)


def check_resnet9_image_side(side: int, layers: Sequence[int], at_step: bool = False) -> None:
    """Fail, naming the options, when images of `side` pixels are too small for the stages' max-pools: data.image_size
    when building, or (`at_step`) a training step's images, which progressive_resizing may have scaled down."""
    smallest = resnet9_smallest_side(layers)
    if side < smallest:
        what, options = (
            (f"images of {side} px", "data.image_size or progressive_resizing.start_side")
            if at_step
            else (f"data.image_size={side}", "data.image_size")
        )
        raise HydraliError(
            f"{what}: model=resnet9 with {len(layers)} stages (model.layers={list(layers)}) takes "
            f"images of {smallest} px and up (each stage halves them): raise {options} or pass fewer stages"
        )
