"""Lightning callbacks of hydrali: the adapter to core's TrainingObserver (each epoch's record, throughput), a
checkpoint that names its files by the epoch counted from 1, and a progress bar that counts epochs from 1 (as the
run log, the summary and Keras' checkpoint names do)."""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from hydrali.core.run.observer import TrainingObserver
from hydrali.core.run.preemption import Preempted, PreemptionWatch


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
    on every backend. Its state (the epoch in progress) goes into every checkpoint, so that an epoch resumed in its
    middle is recorded whole."""

    def __init__(self, observer: TrainingObserver):
        self.observer = observer
        self._validated = False
        self._saved: dict | None = None  # the epoch in progress when the checkpoint resumed from was saved

    def state_dict(self) -> dict:
        """The epoch in progress (core's TrainingObserver.partial_epoch)."""
        return self.observer.partial_epoch()

    def load_state_dict(self, state_dict: dict) -> None:
        """Kept until training starts: an epoch resumed in its middle continues from it."""
        self._saved = dict(state_dict)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._validated = False
        self.observer.epoch_start(trainer.current_epoch)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.observer.started(trainer.current_epoch):  # resumed in the middle of the epoch
            self._validated = False
            self.observer.epoch_resumed(trainer.current_epoch, self._saved or {})
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


class ReaderPosition(L.Callback):
    """Tells the training loader how many batches of the epoch were trained, so that a checkpoint saves DALI's
    state after exactly those (backends/lightning/data.py's ResumableDaliLoader)."""

    def __init__(self, loader):
        self.loader = loader

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.loader.trained = batch_idx + 1


class StopOnSignal(L.Callback):
    """After a training step: when the job's processes agree that one of them received a preemption signal
    (core/run/preemption.py), save `path` (the run's last.ckpt) where the epoch is, then stop with Preempted."""

    def __init__(self, watch: PreemptionWatch, path: Path):
        self.watch, self.path = watch, Path(path)
        self._batches = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self.watch.reassert()  # after DALI's pipelines and the GPU's libraries are loaded

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.watch.reassert()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._batches += 1
        if not self.watch.should_check(self._batches, trainer.world_size):
            return
        if not trainer.strategy.reduce_boolean_decision(self.watch.requested(), all=False):
            return
        partial = self.path.with_name(self.path.name + ".partial")  # a kill while writing leaves last.ckpt whole
        trainer.save_checkpoint(partial, weights_only=False)
        if trainer.is_global_zero:
            os.replace(partial, self.path)
        trainer.strategy.barrier("preempted")
        where = f"at epoch {trainer.current_epoch + 1}, step {batch_idx + 1} of {trainer.num_training_batches}"
        raise Preempted(self.watch.received or self.watch.signals[0], f"checkpoint saved {where} ({self.path})")


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
