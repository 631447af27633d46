"""The learning-rate schedule both backends follow: linear warmup, then cosine decay or constant.

Expressed as a factor of the plan's effective lr at a given optimizer step, so that a torch
LambdaLR and a Keras LearningRateSchedule give the same lr at the same step by construction.
"""
from __future__ import annotations

import math

from hydrali.core.errors import HydraliError

SCHEDULES = ("cosine", "constant")


def lr_factor(step: int, *, steps_per_epoch: int, epochs: int, warmup_epochs: float,
              warmup_div: float, schedule: str) -> float:
    """The multiplier of the effective lr at optimizer step `step` (0-based)."""
    if schedule not in SCHEDULES:
        raise HydraliError(f"optim.schedule={schedule!r}: choose one of {', '.join(SCHEDULES)}")
    total = max(1, steps_per_epoch * epochs)
    warmup = int(round(warmup_epochs * steps_per_epoch))
    if step < warmup:
        start = 1.0 / warmup_div
        return start + (1.0 - start) * step / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))
