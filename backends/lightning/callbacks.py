"""Lightning callbacks of hydrali: the adapter to core's TrainingObserver (each epoch's record, throughput), a
checkpoint that names its files by the epoch counted from 1, and a progress bar that counts epochs from 1 (as the
run log, the summary and Keras' checkpoint names do)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from hydrali.core.run.observer import TrainingObserver


class EpochNumberCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint whose `{epoch}` in file names is the epoch counted from 1 (Lightning counts from
    0): epoch003.ckpt holds the weights after the third epoch, as on Keras and in the run's record."""

    def format_checkpoint_name(self, metrics, *args, **kwargs) -> str:
        """The file name of a checkpoint with these metrics, `epoch` counted from 1."""
        if "epoch" in metrics:
            metrics = {**metrics, "epoch": metrics["epoch"] + 1}
        return super().format_checkpoint_name(metrics, *args, **kwargs)


class Observe(L.Callback):
    """Lightning's hooks, told to core's TrainingObserver (core/run/observer.py): the same record and throughput as
    on every backend."""

    def __init__(self, observer: TrainingObserver):
        self.observer = observer
        self._validated = False

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._validated = False
        self.observer.epoch_start(trainer.current_epoch)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.observer.step_start(
            batch_idx, lambda: trainer.optimizers[0].param_groups[0]["lr"], trainer.num_training_batches
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.observer.step_end()

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.observer.validation_start()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.observer.epoch_end(trainer.current_epoch, dict(trainer.callback_metrics), self._validated)


class _RichEpochsFromOne(RichProgressBar):
    def _get_train_description(self, current_epoch: int) -> str:
        return (
            super()
            ._get_train_description(current_epoch)
            .replace(
                f"Epoch {current_epoch}/{self.trainer.max_epochs - 1}",
                f"Epoch {current_epoch + 1}/{self.trainer.max_epochs}",
            )
        )


class _TQDMEpochsFromOne(TQDMProgressBar):
    def on_train_epoch_start(self, trainer, *args) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch + 1}/{trainer.max_epochs}")


def progress_bar() -> L.Callback:
    """Lightning's own progress bar (Rich where installed, else tqdm), with epochs counted from 1."""
    return _RichEpochsFromOne() if _RICH_AVAILABLE else _TQDMEpochsFromOne()
