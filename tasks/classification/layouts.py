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
