"""The optimizer and lr schedule of the plan on torch: SGD or AdamW over parameter groups with hydrali's weight decay
rule and backbone lr, and the per-step schedule of hydrali.core.optim.schedule."""

from __future__ import annotations

import torch

from hydrali.core.config.schema import Optimizer
from hydrali.core.contracts.run import OptimizerSettings
from hydrali.core.optim.optimizer import ADAM_EPSILON, decays
from hydrali.core.optim.schedule import optimizer_step_factor
from hydrali.core.run.plan import Plan

OPTIMIZERS = {  # optim.name -> torch's optimizer over parameter groups, with the optim node's settings
    Optimizer.sgd: lambda groups, optim, lr: torch.optim.SGD(
        groups, lr=lr, momentum=optim.momentum, nesterov=optim.nesterov
    ),
    Optimizer.adamw: lambda groups, optim, lr: torch.optim.AdamW(
        groups, lr=lr, betas=tuple(optim.betas), eps=ADAM_EPSILON
    ),
}


def make_optimizer(parameters, optim: OptimizerSettings, lr: float, backbone=()) -> torch.optim.Optimizer:
    """SGD (torch's coupled weight decay) or AdamW (decoupled), decaying only what
    hydrali.core.optim.optimizer.decays says; the `backbone` parameters at lr x optim.backbone_lr_mult."""
    parameters, slow = list(parameters), {id(p) for p in backbone}
    on = optim.weight_decay_on
    groups = []
    for in_backbone, factor in ((False, 1.0), (True, optim.backbone_lr_mult)):
        part = [p for p in parameters if (id(p) in slow) == in_backbone]
        if in_backbone and not part:
            continue
        decay, no_decay = [p for p in part if decays(p.shape, on)], [p for p in part if not decays(p.shape, on)]
        groups += [
            {"params": decay, "weight_decay": optim.weight_decay, "lr": lr * factor},
            {"params": no_decay, "weight_decay": 0.0, "lr": lr * factor},
        ]
    return OPTIMIZERS[Optimizer.of(optim.name, "optim.name")](groups, optim, lr)


def make_schedule(
    optimizer: torch.optim.Optimizer, optim: OptimizerSettings, plan: Plan, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The lr schedule of the plan, stepped after every optimizer step: the optimizer's lr times
    hydrali.core.optim.schedule.optimizer_step_factor (warmup, then cosine or constant, over plan.epochs epochs)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: optimizer_step_factor(step, optim, steps_per_epoch=steps_per_epoch, epochs=plan.epochs),
    )
