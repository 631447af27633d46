"""Keras checkpoints: one weights file per epoch (model and optimizer state), and resuming from one."""
from __future__ import annotations

import re
from pathlib import Path

import keras

from backends.keras.callbacks import metric_name
from core.errors import HydraliError

CHECKPOINT_DIR = "checkpoints"
PATTERN = "epoch{epoch:03d}.weights.h5"  # Keras fills {epoch} with the number of epochs completed
_EPOCH = re.compile(r"epoch(\d+)\.weights\.h5$")


def epochs_done(path: Path) -> int:
    """How many epochs a checkpoint file holds, from its name."""
    match = _EPOCH.search(path.name)
    if not match:
        raise HydraliError(f"ckpt_path={path} is not a hydrali Keras checkpoint (epochNNN.weights.h5): "
                           f"a checkpoint of another backend cannot be resumed here")
    return int(match.group(1))


def resolve(ckpt_path: str | None, checkpoint_dir: Path) -> Path | None:
    """The checkpoint to resume from: None, the newest in this run dir for "last", or an existing file."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        found = sorted(checkpoint_dir.glob("epoch*.weights.h5"), key=epochs_done)
        if not found:
            raise HydraliError(f"ckpt_path=last but {checkpoint_dir} holds no Keras checkpoint: pass "
                               f"hydra.run.dir=<the interrupted run's output dir> or ckpt_path=<a .weights.h5 file>")
        return found[-1]
    path = Path(ckpt_path)
    if not path.is_file():
        raise HydraliError(f"ckpt_path={ckpt_path} is not a file: pass an existing checkpoint or ckpt_path=last")
    epochs_done(path)
    return path


class PruneCheckpoints(keras.callbacks.Callback):
    """After each epoch's checkpoint is written, keep only the newest `keep` files and the best one."""

    def __init__(self, checkpoint_dir: Path, keep: int, monitor: str, mode: str):
        super().__init__()
        self.checkpoint_dir, self.keep, self.monitor, self.mode = checkpoint_dir, keep, monitor, mode
        self.best: tuple[float, int] | None = None  # (value, epochs done)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        value = {metric_name(k): v for k, v in (logs or {}).items()}.get(self.monitor)
        if value is not None:
            better = (self.best is None or (value > self.best[0] if self.mode == "max" else value < self.best[0]))
            if better:
                self.best = (float(value), epoch + 1)
        if self.keep <= 0:
            return
        files = sorted(self.checkpoint_dir.glob("epoch*.weights.h5"), key=epochs_done)
        protected = {self.best[1]} if self.best else set()
        for path in files[:-self.keep]:
            if epochs_done(path) not in protected:
                path.unlink()
