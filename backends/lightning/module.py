"""The LightningModule: a task's torch side trained with the optimizer and lr schedule of the plan."""
from __future__ import annotations

import lightning as L
import torch
from omegaconf import DictConfig

from core.plan import Plan
from core.schedule import lr_factor


class HydraliModule(L.LightningModule):
    """Trains `torch_task` (model + loss + metrics) with SGD/AdamW at the plan's effective lr."""

    def __init__(self, torch_task: torch.nn.Module, optim: DictConfig, plan: Plan, steps_per_epoch: int,
                 channels_last: bool = False):
        super().__init__()
        self.torch_task = torch_task
        self.optim = optim
        self.plan = plan
        self.steps_per_epoch = steps_per_epoch
        if channels_last:
            self.torch_task.to(memory_format=torch.channels_last)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, n = self.torch_task.training_loss(batch)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=n, sync_dist=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, n = self.torch_task.validation_step(batch)
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, batch_size=n, sync_dist=True)
        self.log_dict(self.torch_task.val_metrics, on_epoch=True, prog_bar=True)

    def configure_optimizers(self):
        o = self.optim
        decay, no_decay = [], []
        for p in self.torch_task.parameters():
            (no_decay if p.ndim <= 1 else decay).append(p)  # no weight decay on norms and biases
        groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        if str(o.name) == "sgd":
            opt = torch.optim.SGD(groups, lr=self.plan.effective_lr, momentum=o.momentum, nesterov=o.nesterov)
        else:
            opt = torch.optim.AdamW(groups, lr=self.plan.effective_lr, betas=tuple(o.betas))
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(
            step, steps_per_epoch=self.steps_per_epoch, epochs=self.plan.epochs,
            warmup_epochs=o.warmup_epochs, warmup_div=o.warmup_div, schedule=str(o.schedule)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
