"""Lightning callbacks of hydrali: per-epoch metrics to the tracker, and training throughput."""
from __future__ import annotations

import time

import lightning as L


class EpochRecorder(L.Callback):
    """After each epoch (validation included), record its metrics and log them to the tracker (step = epoch)."""

    def __init__(self, tracker, prefixes=("train/", "val/")):
        self.tracker = tracker
        self.prefixes = prefixes
        self.history: list[dict] = []
        self.first_epoch: int | None = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.first_epoch is None:
            self.first_epoch = trainer.current_epoch

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k.startswith(self.prefixes) and not k.endswith("_step")}
        metrics = {k.removesuffix("_epoch"): v for k, v in metrics.items()}
        metrics["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        if trainer.is_global_zero:
            self.tracker.log_metrics(metrics, step=trainer.current_epoch)
        self.history.append({"epoch": trainer.current_epoch, **metrics})


class Throughput(L.Callback):
    """Images per second over training steps only (validation and start-up excluded), all replicas together."""

    def __init__(self):
        self.images = 0
        self.seconds = 0.0
        self._epoch_start: float | None = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._epoch_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        first_output = next(iter(batch.values()))
        self.images += int(first_output.shape[0]) * trainer.world_size

    def on_validation_start(self, trainer, pl_module) -> None:
        self._close_epoch()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._close_epoch()

    def _close_epoch(self) -> None:
        if self._epoch_start is not None:
            self.seconds += time.perf_counter() - self._epoch_start
            self._epoch_start = None
