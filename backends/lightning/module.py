"""The LightningModule: a task's torch side trained with the optimizer and lr schedule of the plan."""
from __future__ import annotations

import lightning as L
import torch
from omegaconf import DictConfig

from hydrali.core.errors import HydraliError
from hydrali.core.optim.optimizer import ADAM_EPSILON, decays
from hydrali.core.run.plan import Plan
from hydrali.core.optim.schedule import lr_factor


def make_optimizer(parameters, optim: DictConfig, lr: float) -> torch.optim.Optimizer:
    """SGD (torch's coupled weight decay) or AdamW (decoupled), decaying only what hydrali.core.optim.optimizer.decays says."""
    decay, no_decay = [], []
    for p in parameters:
        (decay if decays(p.shape) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if str(optim.name) == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=optim.momentum, nesterov=optim.nesterov)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(optim.betas), eps=ADAM_EPSILON)


def compile_network(torch_task: torch.nn.Module, *, mode: str = "default", fullgraph: bool = False,
                    dynamic: bool | None = None) -> torch.nn.Module:
    """torch.compile the task's network (its `model`) in place: its `forward` becomes the compiled one, with no
    wrapper module, so the state_dict keys stay as they are and a checkpoint loads whether it was written compiled
    or not. Training and validation both call the compiled network; the loss and metrics around it run eagerly.
    (nn.Module.compile would compile `__call__`, which TorchDynamo skips for a network made of torch.nn containers
    only, such as an nn.Sequential: nothing would be compiled.) Returns the network."""
    network = getattr(torch_task, "model", None)
    if not isinstance(network, torch.nn.Module):
        raise HydraliError(f"backend.compile=true: the task's torch side ({type(torch_task).__name__}) keeps no "
                           f"network in `.model` to compile: set backend.compile=false")
    network.forward = torch.compile(network.forward, mode=mode,
                                    fullgraph=fullgraph, dynamic=dynamic)
    return network


class HydraliModule(L.LightningModule):
    """Trains `torch_task` (model + loss + metrics) with SGD/AdamW at the plan's effective lr."""

    def __init__(self, torch_task: torch.nn.Module, optim: DictConfig, plan: Plan, steps_per_epoch: int,
                 channels_last: bool = False, step_loss_in_bar: bool = False):
        super().__init__()
        self.torch_task = torch_task
        self.optim = optim
        self.plan = plan
        self.steps_per_epoch = steps_per_epoch
        self.step_loss_in_bar = step_loss_in_bar
        if channels_last:
            self.torch_task.to(memory_format=torch.channels_last)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, n = self.torch_task.training_loss(batch)
        # the epoch's mean over every process, synced once at the epoch's end (a step value with sync_dist would
        # all-reduce at every step); a progress bar shows this process's own loss of each step
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=n, sync_dist=True)
        if self.step_loss_in_bar:
            self.log("loss", loss, on_step=True, on_epoch=False, prog_bar=True, logger=False, batch_size=n)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        if next(iter(batch.values())).shape[0] == 0:
            return  # a batch of padding only (a shard shorter than the others by a whole batch): nothing to score
        loss, n = self.torch_task.validation_step(batch)
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, batch_size=n, sync_dist=True)
        self.log("val/images", float(n), on_epoch=True, reduce_fx="sum", sync_dist=True, batch_size=1)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            self.torch_task.val_metrics_reset()
            return
        # the task's metrics over the whole validation set, already gathered from every process
        metrics = self.torch_task.val_metrics_compute(self.current_epoch)
        self.log_dict({name: float(value) for name, value in metrics.items()}, prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        o = self.optim
        opt = make_optimizer(self.torch_task.parameters(), o, self.plan.effective_lr)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(
            step, steps_per_epoch=self.steps_per_epoch, epochs=self.plan.epochs,
            warmup_epochs=o.warmup_epochs, warmup_div=o.warmup_div, schedule=str(o.schedule)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
