"""Lightning callbacks of hydrali: each epoch's metrics into core's run record, training throughput, and a
progress bar that counts epochs from 1 (as the run log and the summary do)."""
from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from hydrali.core.run.record import RunRecord
from hydrali.core.run.throughput import StepClock


class EpochRecorder(L.Callback):
    """After each epoch, hand its metrics to the run record: train/loss, train/images, lr/first, lr/last,
    and the val/ metrics only when validation ran in this epoch."""

    def __init__(self, record: RunRecord):
        self.record = record
        self.first_epoch: int | None = None
        self._validated = False
        self._images = 0
        self._lrs: list[float] = []
        self._epoch: int | None = None   # the epoch whose start this callback saw

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.first_epoch is None:
            self.first_epoch = trainer.current_epoch
            self.record.start(trainer.current_epoch)
        self._validated, self._images, self._lrs, self._epoch = False, 0, [], trainer.current_epoch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._lrs.append(float(trainer.optimizers[0].param_groups[0]["lr"]))  # the lr this step uses

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._images += int(next(iter(batch.values())).shape[0]) * trainer.world_size

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._epoch != trainer.current_epoch:
            return  # the end of an epoch finished before a resume (a checkpoint taken at its validation)
        prefixes = ("train/", "val/") if self._validated else ("train/",)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(prefixes)}
        metrics["train/images"] = self._images
        if self._lrs:
            metrics["lr/first"], metrics["lr/last"] = self._lrs[0], self._lrs[-1]
        self.record.add(trainer.current_epoch, metrics)


class Throughput(L.Callback):
    """Training steps timed by core's StepClock (validation excluded): the run's images/s, whole and steady."""

    def __init__(self, warmup_steps: int, global_batch: int):
        self.clock = StepClock(warmup_steps)
        self.global_batch = global_batch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.clock.epoch_start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.clock.step_end(self.global_batch)   # every training batch is whole (core.run.epoch's contract)

    def on_validation_start(self, trainer, pl_module) -> None:
        self.clock.training_end()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.clock.training_end()


class _RichEpochsFromOne(RichProgressBar):
    def _get_train_description(self, current_epoch: int) -> str:
        return super()._get_train_description(current_epoch).replace(
            f"Epoch {current_epoch}/{self.trainer.max_epochs - 1}", f"Epoch {current_epoch + 1}/{self.trainer.max_epochs}")


class _TQDMEpochsFromOne(TQDMProgressBar):
    def on_train_epoch_start(self, trainer, *args) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch + 1}/{trainer.max_epochs}")


def progress_bar() -> L.Callback:
    """Lightning's own progress bar (Rich where installed, else tqdm), with epochs counted from 1."""
    return _RichEpochsFromOne() if _RICH_AVAILABLE else _TQDMEpochsFromOne()
