"""Keras checkpoints: one weights file per epoch that saves (model and optimizer state), the newest kept and the
best."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

import keras

from hydrali.core.errors import HydraliError
from hydrali.core.policies import retention
from hydrali.core.run.record import RunRecord

PATTERN = "epoch{epoch:03d}.weights.h5"  # Keras fills {epoch} with the number of epochs completed
_EPOCH = re.compile(r"epoch(\d+)\.weights\.h5$")
PARTIAL = "partial-{pid}-{name}"  # a checkpoint being written, renamed to its own name once whole


def epochs_done(path: Path) -> int:
    """How many epochs a checkpoint file holds, from its name."""
    match = _EPOCH.search(Path(path).name)
    if not match:
        raise HydraliError(
            f"ckpt_path={path} is not a hydrali Keras checkpoint (epochNNN.weights.h5): rename it "
            f"as the epochs it holds, e.g. epoch003.weights.h5"
        )
    return int(match.group(1))


def epochs_in(path: Path) -> int:
    """How many epochs a checkpoint file holds; one line if it is not a Keras weights file (HDF5) hydrali wrote."""
    import h5py

    done = epochs_done(path)
    if not h5py.is_hdf5(path):
        raise HydraliError(
            f"ckpt_path={path} is not a Keras weights file (HDF5): pass a .weights.h5 file that "
            f"hydrali wrote, or ckpt_path=last"
        )
    return done


def newest(checkpoint_dir: Path) -> Path | None:
    """The checkpoint of the most epochs in `checkpoint_dir`, if any."""
    found = (
        sorted(Path(checkpoint_dir).glob("epoch*.weights.h5"), key=epochs_done) if Path(checkpoint_dir).is_dir() else []
    )
    return found[-1] if found else None


def drop_later(checkpoint_dir: Path, epochs: int) -> None:
    """Delete the checkpoints of more than `epochs` epochs: a run resumed from an earlier one abandons them."""
    retention.drop_after(saved_files(checkpoint_dir), epochs)


def file_of(checkpoint_dir: Path, epoch: int) -> Path:
    """The checkpoint written at the end of epoch `epoch` (counted from 1, as the run record counts)."""
    return Path(checkpoint_dir) / PATTERN.format(epoch=epoch)


def saved_files(checkpoint_dir: Path) -> dict[int, Path]:
    """The per-epoch checkpoints in `checkpoint_dir`, by the epoch each holds (counted from 1)."""
    folder = Path(checkpoint_dir)
    return {epochs_done(path): path for path in folder.glob("epoch*.weights.h5")} if folder.is_dir() else {}


def best_saved(checkpoint_dir: Path, record: RunRecord, monitor: str, mode: str) -> Path | None:
    """The checkpoint of the best epoch by `monitor` among the epochs of the run record that have one (with
    checkpoint_every above 1, the best epoch may have none), or None."""
    files = saved_files(checkpoint_dir)
    best = retention.best_saved_epoch(files, record.rows, monitor, mode)
    return None if best is None else files[best]


class EpochCheckpoint(keras.callbacks.Callback):
    """The weights (the model's and the optimizer's) at the end of the epochs that `saves` (the run contract's
    saves_checkpoint, epochs counted from 1) names: every checkpoint_every-th and the last, as on every backend.
    Each file is written under a passing name and then renamed: a stop in the middle of a write (Ctrl+C, a
    sweep's SIGTERM) leaves the epoch before it the newest, whole, rather than a damaged file a resume would stop at
    (Lightning writes its files through a transaction for the same reason)."""

    def __init__(self, filepath: str, saves: Callable[[int], bool]):
        super().__init__()
        self.filepath, self.saves = filepath, saves

    def on_train_begin(self, logs=None) -> None:
        """Writes an earlier attempt left half done are deleted."""
        for leftover in Path(self.filepath).parent.glob(PARTIAL.format(pid="*", name="*")):
            leftover.unlink(missing_ok=True)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if not self.saves(epoch + 1):
            return
        path = Path(self.filepath.format(epoch=epoch + 1))
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(PARTIAL.format(pid=os.getpid(), name=path.name))  # .weights.h5, as Keras asks
        self.model.save_weights(str(partial), overwrite=True)
        os.replace(partial, path)


class PruneCheckpoints(keras.callbacks.Callback):
    """After each epoch's checkpoint is written, the files that keep_checkpoints does not keep removed (core's rule:
    the newest `keep` and the best of the whole run record that has a file, epochs before an interruption
    included)."""

    def __init__(self, checkpoint_dir: Path, keep: int, record: RunRecord, monitor: str, mode: str):
        super().__init__()
        self.checkpoint_dir, self.keep, self.record, self.monitor, self.mode = (
            checkpoint_dir,
            keep,
            record,
            monitor,
            mode,
        )

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        retention.prune(saved_files(self.checkpoint_dir), self.record, self.keep, self.monitor, self.mode)
