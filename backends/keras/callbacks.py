"""Keras callbacks of hydrali: each epoch's metrics into core's run record (Lightning's names), and throughput."""
from __future__ import annotations

import keras

from hydrali.core.run.record import RunRecord
from hydrali.core.run.throughput import StepClock


def metric_name(keras_name: str) -> str:
    """Keras' log name as hydrali names it: loss -> train/loss, val_acc -> val/acc, images -> train/images."""
    if keras_name.startswith("val_"):
        return "val/" + keras_name[len("val_"):]
    return "train/" + keras_name


class EpochRecorder(keras.callbacks.Callback):
    """After each epoch, hand its metrics to the run record: train/loss, train/images, lr/first, lr/last,
    and the val/ metrics when validation ran (Keras logs them only then)."""

    def __init__(self, record: RunRecord, steps_per_epoch: int, train_metrics=("loss", "images")):
        super().__init__()
        self.record = record
        self.steps_per_epoch = steps_per_epoch
        self.train_metrics = train_metrics   # training metrics kept (Lightning logs only train/loss)
        self.first_epoch: int | None = None
        self._lrs: dict[str, float] = {}

    def _lr(self) -> float:
        return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))  # the lr of the next step

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        if self.first_epoch is None:
            self.first_epoch = epoch
            self.record.start(epoch)
        self._lrs = {}

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        if batch == 0:
            self._lrs["lr/first"] = self._lr()
        if batch == self.steps_per_epoch - 1:
            self._lrs["lr/last"] = self._lr()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        metrics = {metric_name(k): float(v) for k, v in (logs or {}).items()
                   if k.startswith("val_") or k in self.train_metrics}
        self.record.add(epoch, {**metrics, **self._lrs})


class Throughput(keras.callbacks.Callback):
    """Training steps timed by core's StepClock (validation excluded): the run's images/s, whole and steady."""

    def __init__(self, warmup_steps: int, global_batch: int):
        super().__init__()
        self.clock = StepClock(warmup_steps)
        self.global_batch = global_batch

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self.clock.epoch_start()

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        self.clock.step_end(self.global_batch)

    def on_test_begin(self, logs=None) -> None:
        self.clock.training_end()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        self.clock.training_end()
