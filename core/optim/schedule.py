"""The learning-rate schedule both backends follow: linear warmup (in epochs or in steps), then cosine or linear decay
to zero, constant, or flat then cosine (fast.ai's fit_flat_cos: the full lr for a share of the steps, then cosine).

Expressed as a factor of the plan's effective lr at a given optimizer step, so that a torch
LambdaLR and a Keras LearningRateSchedule give the same lr at the same step by construction.
"""

from __future__ import annotations

import math

from hydrali.core.config.schema import Schedule


def _cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


AFTER_WARMUP = {  # optim.schedule -> the lr factor as a function of the progress after warmup (0 to 1) and of
    #   optim.flat_fraction (the share of that progress at the full lr, for flat_cosine)
    Schedule.cosine: lambda progress, flat: _cosine(progress),
    Schedule.linear: lambda progress, flat: 1.0 - progress,
    Schedule.constant: lambda progress, flat: 1.0,
    Schedule.flat_cosine: lambda progress, flat: 1.0 if progress <= flat else _cosine((progress - flat) / (1.0 - flat)),
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
    flat_fraction: float = 0.75,
) -> float:
    """The multiplier of the effective lr at optimizer step `step` (0-based); `warmup_steps`, when given, replaces
    `warmup_epochs`; `flat_fraction`: flat_cosine's share of the steps after warmup at the full lr."""
    after_warmup = AFTER_WARMUP[Schedule.of(schedule, "optim.schedule")]
    total = max(1, steps_per_epoch * epochs)
    warmup = int(round(warmup_epochs * steps_per_epoch)) if warmup_steps is None else min(int(warmup_steps), total)
    if step < warmup:
        start = 1.0 / warmup_div
        return start + (1.0 - start) * step / warmup
    return after_warmup(min(1.0, (step - warmup) / max(1, total - warmup)), flat_fraction)


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
        flat_fraction=optim.flat_fraction,
    )
