"""The learning-rate schedule both backends follow: linear warmup (in epochs or in steps), then cosine or linear decay
to zero, or constant.

Expressed as a factor of the plan's effective lr at a given optimizer step, so that a torch
LambdaLR and a Keras LearningRateSchedule give the same lr at the same step by construction.
"""

from __future__ import annotations

import math

from hydrali.core.config.schema import Schedule

AFTER_WARMUP = {  # optim.schedule -> the lr factor as a function of the progress after warmup (0 to 1)
    Schedule.cosine: lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
    Schedule.linear: lambda progress: 1.0 - progress,
    Schedule.constant: lambda progress: 1.0,
}


def lr_factor(
    step: int,
    *,
    steps_per_epoch: int,
    epochs: int,
    warmup_epochs: float,
    warmup_div: float,
    schedule: str,
    warmup_steps: int | None = None,
) -> float:
    """The multiplier of the effective lr at optimizer step `step` (0-based); `warmup_steps`, when given, replaces
    `warmup_epochs`."""
    after_warmup = AFTER_WARMUP[Schedule.of(schedule, "optim.schedule")]
    total = max(1, steps_per_epoch * epochs)
    warmup = int(round(warmup_epochs * steps_per_epoch)) if warmup_steps is None else min(int(warmup_steps), total)
    if step < warmup:
        start = 1.0 / warmup_div
        return start + (1.0 - start) * step / warmup
    return after_warmup(min(1.0, (step - warmup) / max(1, total - warmup)))


def optimizer_step_factor(step: int, optim, *, steps_per_epoch: int, epochs: int) -> float:
    """lr_factor at optimizer step `step` under an OptimizerSettings' (hydrali.core.contracts.run) warmup and
    schedule, over `epochs` epochs of `steps_per_epoch` optimizer steps: what every backend's schedule asks."""
    return lr_factor(
        step,
        steps_per_epoch=steps_per_epoch,
        epochs=epochs,
        warmup_epochs=optim.warmup_epochs,
        warmup_div=optim.warmup_div,
        schedule=str(optim.schedule),
        warmup_steps=optim.warmup_steps,
    )
