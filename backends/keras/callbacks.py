"""Keras callbacks of hydrali: per-epoch metrics to the tracker (Lightning's names), and throughput."""
from __future__ import annotations

import time

import keras


def metric_name(keras_name: str) -> str:
    """Keras' log name as hydrali names it: loss -> train/loss, val_acc -> val/acc, learning_rate -> lr."""
    if keras_name == "learning_rate":
        return "lr"
    if keras_name.startswith("val_"):
        return "val/" + keras_name[len("val_"):]
    return "train/" + keras_name


class EpochRecorder(keras.callbacks.Callback):
    """After each epoch, record its metrics and log them to the tracker (step = epoch, 0-based)."""

    def __init__(self, tracker, train_metrics=("loss",)):
        super().__init__()
        self.tracker = tracker
        self.train_metrics = train_metrics  # training metrics kept (Lightning logs only train/loss)
        self.history: list[dict] = []
        self.first_epoch: int | None = None

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        if self.first_epoch is None:
            self.first_epoch = epoch

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        metrics = {metric_name(k): float(v) for k, v in (logs or {}).items()
                   if k.startswith("val_") or k in self.train_metrics or k == "learning_rate"}
        if "lr" not in metrics:
            opt = self.model.optimizer
            metrics["lr"] = float(keras.ops.convert_to_numpy(opt.learning_rate))
        self.tracker.log_metrics(metrics, step=epoch)
        self.history.append({"epoch": epoch, **metrics})


class Throughput(keras.callbacks.Callback):
    """Images per second over training steps only (validation and start-up excluded), all replicas together."""

    def __init__(self, global_batch: int):
        super().__init__()
        self.global_batch = global_batch
        self.images = 0
        self.seconds = 0.0
        self._start: float | None = None

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        self.images += self.global_batch

    def on_test_begin(self, logs=None) -> None:
        self._close()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        self._close()

    def _close(self) -> None:
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None
