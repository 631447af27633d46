"""Callbacks that record, from outside a backend, the trainable weights a run had: after every optimizer step (the
live weights), at the first batch of every validation (the weights validation scored) and at the first batch the
run trains (the weights it starts from). Plugged in as a user's callback (`+backend.callbacks.<key>={_target_:
tests.support.weight_snapshots.<name>, path: ...}`); each writes {"start": [arrays], "steps": [[arrays] per optimizer
step], "scored": [[arrays] per validation]} to `path` (a pickle) after every epoch and when training ends (Keras adds
"final": the weights fit ends with). Used by tests/test_ema.py."""

from __future__ import annotations

import pickle
from pathlib import Path


def read_snapshots(path: Path) -> dict:
    """What a snapshot callback wrote to `path`."""
    return pickle.loads(Path(path).read_bytes())


def _write(path: str, record: dict) -> None:
    Path(path).write_bytes(pickle.dumps(record))


class LightningWeightSnapshots:
    """The LightningModule's trainable parameters after each optimizer step, at each validation's first batch (not
    the sanity check's) and at the first batch trained."""

    def __new__(cls, path: str):
        import lightning as L

        def trainable(module):
            return [p.detach().cpu().numpy().copy() for p in module.parameters() if p.requires_grad]

        class _Snapshots(L.Callback):
            def __init__(self):
                self.record, self.steps_seen = {"steps": [], "scored": []}, 0

            def on_train_start(self, trainer, pl_module) -> None:
                self.steps_seen = trainer.global_step  # a resumed run counts the steps before it

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                self.record.setdefault("start", trainable(pl_module))

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                if trainer.global_step > self.steps_seen:  # global_step counts optimizer steps
                    self.steps_seen = trainer.global_step
                    self.record["steps"].append(trainable(pl_module))

            def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
                if batch_idx == 0 and not trainer.sanity_checking:
                    self.record["scored"].append(trainable(pl_module))

            def on_train_epoch_end(self, trainer, pl_module) -> None:
                _write(path, self.record)

            def on_train_end(self, trainer, pl_module) -> None:
                _write(path, self.record)

        return _Snapshots()


class KerasWeightSnapshots:
    """The Keras model's trainable weights after each optimizer step (as its optimizer's `iterations` counts them),
    at each validation's first batch and at the first batch trained."""

    def __new__(cls, path: str):
        import keras

        def trainable(model):
            return [keras.ops.convert_to_numpy(w).copy() for w in model.trainable_weights]

        class _Snapshots(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.record, self.steps_seen = {"steps": [], "scored": []}, 0

            def _optimizer_steps(self) -> int:
                return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

            def on_train_begin(self, logs=None) -> None:
                self.steps_seen = self._optimizer_steps()  # a resumed run's optimizer counts the steps before it

            def on_train_batch_begin(self, batch: int, logs=None) -> None:
                self.record.setdefault("start", trainable(self.model))

            def on_train_batch_end(self, batch: int, logs=None) -> None:
                steps = self._optimizer_steps()
                if steps > self.steps_seen:
                    self.steps_seen = steps
                    self.record["steps"].append(trainable(self.model))

            def on_test_batch_begin(self, batch: int, logs=None) -> None:
                if batch == 0:
                    self.record["scored"].append(trainable(self.model))

            def on_epoch_end(self, epoch: int, logs=None) -> None:
                _write(path, self.record)

            def on_train_end(self, logs=None) -> None:
                self.record["final"] = trainable(self.model)
                _write(path, self.record)

        return _Snapshots()
