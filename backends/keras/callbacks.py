"""Keras callbacks of hydrali: the adapter to core's TrainingObserver (each epoch's record in Lightning's names,
throughput)."""

from __future__ import annotations

from pathlib import Path

import keras

from hydrali.backends.keras import checkpoints
from hydrali.core.process.preemption import Preempted, PreemptionWatch
from hydrali.core.run.observer import TrainingObserver


def metric_name(keras_name: str) -> str:
    """Keras' log name as hydrali names it: loss -> train/loss, val_acc -> val/acc, images -> train/images."""
    if keras_name.startswith("val_"):
        return "val/" + keras_name[len("val_") :]
    return "train/" + keras_name


class Observe(keras.callbacks.Callback):
    """Keras' hooks, told to core's TrainingObserver (core/run/observer.py): the same record and throughput as on
    every backend. Keras logs val_ metrics only in epochs that validated."""

    def __init__(self, observer: TrainingObserver):
        super().__init__()
        self.observer = observer

    def _lr(self) -> float:
        return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))  # the lr of the next step

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self.observer.epoch_start(epoch)

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        self.observer.step_start(batch, self._lr)

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        self.observer.step_end()

    def on_test_begin(self, logs=None) -> None:
        self.observer.validation_start()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        logs = logs or {}
        metrics = {metric_name(k): v for k, v in logs.items() if k.startswith("val_") or k == "loss"}
        self.observer.epoch_end(epoch, metrics, validated=any(k.startswith("val_") for k in logs))


class StopOnSignal(keras.callbacks.Callback):
    """After a training step: when this process received a preemption signal (core/process/preemption.py), stop with
    Preempted. DALI's TensorFlow plugin keeps no reader state, so Keras resumes from its newest checkpoint, the end
    of the last whole epoch: the interrupted epoch is trained again from its start."""

    def __init__(self, watch: PreemptionWatch, checkpoint_dir: Path):
        super().__init__()
        self.watch, self.checkpoint_dir = watch, Path(checkpoint_dir)
        self._epoch = 0

    def on_train_begin(self, logs=None) -> None:
        self.watch.reassert()  # after DALI's pipelines and the GPU's libraries are loaded

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._epoch = epoch
        self.watch.reassert()

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        if not self.watch.requested():
            return
        newest = checkpoints.newest(self.checkpoint_dir)
        raise Preempted(
            self.watch.received,
            f"stopped at epoch {self._epoch + 1}, step {batch + 1}; Keras resumes at the start of that epoch, from "
            f"{newest or 'its first weights'} (DALI's TensorFlow plugin keeps no reader state to resume mid-epoch)",
        )


class AverageInCheckpoints(keras.callbacks.SwapEMAWeights):
    """With optim.ema_decay: validation scores the optimizer's average of the weights (hydrali.core.optim.ema), and
    from each epoch's end to the next epoch's start the average is in the model, the live weights in the optimizer's
    average slots, so that the epoch's checkpoint (placed after this callback) holds the average as the network's
    weights (what hydrali eval, predict and export load) and the live weights in its optimizer state; after the
    last epoch the model keeps the average. `resumed`: training starts from such a checkpoint, whose weights go back
    in place when the first epoch starts."""

    def __init__(self, resumed: bool):
        super().__init__(swap_on_epoch=True)
        self._ema_weights_in_model = resumed

    def on_epoch_end(self, epoch, logs=None):
        """Put the average into the model for the epoch's checkpoint, the live weights into the optimizer's slots;
        also after the last epoch (Keras' own callback then copies the average into the slots before the checkpoint
        is written, which would lose the live weights a later `ckpt_path=last epochs=<more>` trains on:
        KeepAverageAfterFit does that once the checkpoint is written)."""
        if not self._ema_weights_in_model:
            self._swap_variables()
            self._ema_weights_in_model = True


class KeepAverageAfterFit(keras.callbacks.SwapEMAWeights):
    """After the last epoch's checkpoint (placed after it): the optimizer's slots take the average the model holds,
    so that fit, which ends by copying the slots into the model, leaves the model with the average."""

    def __init__(self):
        super().__init__(swap_on_epoch=False)

    def on_epoch_end(self, epoch, logs=None):
        """At the last epoch's end, the model's weights (the average) into the optimizer's average slots."""
        if epoch == self.params["epochs"] - 1:
            self._finalize_ema_values()

    def on_test_begin(self, logs=None):  # validation is AverageInCheckpoints' to swap
        pass

    def on_test_end(self, logs=None):
        pass

    def on_predict_begin(self, logs=None):
        pass

    def on_predict_end(self, logs=None):
        pass
