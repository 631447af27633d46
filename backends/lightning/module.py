"""The LightningModule around a task's torch side (its memory format; the optimizer and lr schedule of the plan, from
hydrali.backends.torch.optim; the average of its weights, from hydrali.backends.torch.ema), and Lightning's precision
plugin of `backend.precision`.

Both are public so that what the benchmark measures (bench/torch_loops.py) is built by the same code.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision

from hydrali.backends.torch.ema import WeightAverage, restore_live_weights
from hydrali.backends.torch.optim import make_optimizer, make_schedule
from hydrali.backends.torch.resizing import scaled
from hydrali.core.contracts.run import OptimizerSettings
from hydrali.core.distributed import gather
from hydrali.core.run.plan import Plan


def precision_plugin(precision: str, device_type: str) -> Precision:
    """Lightning's precision plugin for `backend.precision` on one device of `device_type` (cpu | cuda), as the
    Trainer builds it from `precision=`: autocast in its `forward_context()`, and its `scaler` with 16-mixed."""
    if precision == "32-true":
        return Precision()
    if precision == "16-mixed" and device_type == "cpu":
        precision = "bf16-mixed"  # as the Trainer does: torch has no float16 autocast with a scaler on the CPU
    return MixedPrecision(precision, device_type)


EPOCH_LOSS_KEY = "hydrali_epoch_loss"  # a checkpoint's [sum of loss x samples, samples] of the epoch in progress,
#   one pair per process, by global rank


class HydraliModule(L.LightningModule):
    """Trains `torch_task` (model + loss + metrics) with SGD/AdamW at the plan's effective lr; with optim.ema_decay,
    keeps the average of its weights (hydrali.core.optim.ema), which validation scores and checkpoints hold."""

    def __init__(
        self,
        torch_task: torch.nn.Module,
        optim: OptimizerSettings,
        plan: Plan,
        steps_per_epoch: int,
        channels_last: bool = False,
        step_loss_in_bar: bool = False,
        training_size=None,
    ):
        super().__init__()
        self.torch_task = torch_task  # named hydrali.backends.torch.side.SIDE: its checkpoint keys start so
        self.optim = optim
        self.plan = plan
        self.steps_per_epoch = steps_per_epoch
        self.step_loss_in_bar = step_loss_in_bar
        self.training_size = training_size  # epoch -> its batches' size in pixels, or None (progressive_resizing)
        if channels_last:
            self.torch_task.to(memory_format=torch.channels_last)
        # this process's sum of loss x samples and its samples over the epoch so far, kept in checkpoints: an epoch
        # resumed in its middle has the train/loss of the uninterrupted epoch
        self._loss_sum: torch.Tensor | float = 0.0
        self._loss_samples = 0
        ema_decay = optim.ema_decay
        self.weight_average = WeightAverage(self, ema_decay) if ema_decay is not None else None

    def on_train_epoch_start(self) -> None:
        self._loss_sum, self._loss_samples = 0.0, 0

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Every process's sums of the epoch in progress, by global rank (a collective: Lightning builds the
        checkpoint on every process and writes rank 0's)."""
        checkpoint[EPOCH_LOSS_KEY] = gather.gather_objects([float(self._loss_sum), self._loss_samples])
        if self.weight_average is not None:  # its weights the average, the live ones kept beside for a resume
            self.weight_average.into_checkpoint(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """This process's sums of the epoch in progress (a checkpoint of one pair: written by one process, or
        before the pairs were gathered; of another number of processes: the epoch's loss starts afresh)."""
        pairs = checkpoint.get(EPOCH_LOSS_KEY, [0.0, 0])
        if pairs and not isinstance(pairs[0], (list, tuple)):
            pairs = [pairs]
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self._trainer is not None else (0, 1)
        self._loss_sum, self._loss_samples = pairs[rank] if len(pairs) == world else (0.0, 0)
        # before Lightning loads the state_dict: the live weights go back into it, the average into weight_average
        if self.weight_average is not None:
            self.weight_average.from_checkpoint(checkpoint)
        else:
            restore_live_weights(checkpoint)

    def optimizer_step(self, *args, **kwargs) -> None:
        """Lightning's optimizer step (once per accumulation of batches), then the average of the weights."""
        super().optimizer_step(*args, **kwargs)
        if self.weight_average is not None:
            self.weight_average.update()

    def on_validation_start(self) -> None:
        if self.weight_average is not None:  # validation scores the average
            self.weight_average.swap_in()

    def on_validation_end(self) -> None:
        if self.weight_average is not None:
            self.weight_average.swap_out()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        size = self.training_size(self.current_epoch) if self.training_size is not None else None
        if size is not None:  # progressive_resizing (classification: the batch's images, then its labels)
            batch = {**batch, "images": scaled(batch["images"], size)}
        loss, n = self.torch_task.training_loss(batch)
        self._loss_sum = self._loss_sum + loss.detach().double() * n
        self._loss_samples += n
        if batch_idx == self.trainer.num_training_batches - 1:
            # the epoch's mean over every process, synced once at the epoch's end (a step value with sync_dist
            # would all-reduce at every step)
            mean = self._loss_sum / self._loss_samples
            self.log("train/loss", mean, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
        # a progress bar shows this process's own loss of each step
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
        backbone = []  # with optim.backbone_lr_mult, from a side that tells its backbone from its head
        if self.optim.backbone_lr_mult != 1.0:
            backbone = self.torch_task.backbone_parameters()
        opt = make_optimizer(self.torch_task.parameters(), self.optim, self.plan.effective_lr, backbone)
        schedule = make_schedule(opt, self.optim, self.plan, self.steps_per_epoch)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
