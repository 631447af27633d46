"""The learning-rate schedule both backends follow: linear warmup, then cosine decay or constant.

Expressed as a factor of the plan's effective lr at a given optimizer step, so that a torch
LambdaLR and a Keras LearningRateSchedule give the same lr at the same step by construction.
"""

from __future__ import annotations

import math

from hydrali.core.config.schema import Schedule

AFTER_WARMUP = {  # optim.schedule -> the lr factor as a function of the progress after warmup (0 to 1)
    Schedule.cosine: lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
    Schedule.constant: lambda progress: 1.0,
}


def lr_factor(
    step: int, *, steps_per_epoch: int, epochs: int, warmup_epochs: float, warmup_div: float, schedule: str
) -> float:
    """The multiplier of the effective lr at optimizer step `step` (0-based)."""
    after_warmup = AFTER_WARMUP[Schedule.of(schedule, "optim.schedule")]
    total = max(1, steps_per_epoch * epochs)
    warmup = int(round(warmup_epochs * steps_per_epoch))
    if step < warmup:
        start = 1.0 / warmup_div
        return start + (1.0 - start) * step / warmup
    return after_warmup(min(1.0, (step - warmup) / max(1, total - warmup)))
