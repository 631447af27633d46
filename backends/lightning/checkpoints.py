"""Lightning's checkpoint files in hydrali: epochNNN.ckpt after each epoch the run contract saves (epochs counted
from 1, as on Keras and in the run record), last.ckpt as a second name of the newest (a hard link: written once),
and the files that keep_checkpoints does not keep pruned by core's rule (core/policies/retention.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from hydrali.core.policies import retention
from hydrali.core.run.record import RunRecord

EPOCH_FILE = "epoch{epoch:03d}"  # the name (without .ckpt) of the checkpoint after epoch N
LAST = "last.ckpt"  # the second name of the newest checkpoint (or a checkpoint of an epoch stopped mid-way)
_EPOCH = re.compile(r"^epoch(\d+)\.ckpt$")


def epoch_files(checkpoint_dir: Path) -> dict[int, Path]:
    """The per-epoch checkpoints in `checkpoint_dir`, by the epoch each holds (counted from 1)."""
    folder = Path(checkpoint_dir)
    found = ((_EPOCH.match(path.name), path) for path in folder.iterdir()) if folder.is_dir() else ()
    return {int(match.group(1)): path for match, path in found if match}


def read_lazily(path: Path) -> dict:
    """The Lightning checkpoint at `path`, its tensors mapped from the file rather than read (an error of torch's
    if it is not a checkpoint)."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def epochs_of(state: dict) -> int:
    """How many whole epochs a loaded Lightning checkpoint holds (a KeyError if it is not one)."""
    return int(state["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"])


def whole_epochs(path: Path) -> int:
    """How many whole epochs the Lightning checkpoint at `path` holds (an error of torch's if it is not one)."""
    return epochs_of(read_lazily(path))


def _holds(path: Path, epochs: int) -> bool:
    """Whether `path` reads as a Lightning checkpoint of `epochs` whole epochs (a file cut short does not)."""
    try:
        return whole_epochs(path) == epochs
    except Exception:  # torch raises many types for a damaged file
        return False


def newest(checkpoint_dir: Path) -> Path | None:
    """The checkpoint in `checkpoint_dir` holding the most training, or None: last.ckpt, unless a stop came after
    an epoch's file was whole and before last.ckpt named it (then that epoch's file). An epoch's file that does not
    read whole (a stop while it was copied in from the temporary folder) is passed over."""
    folder = Path(checkpoint_dir)
    last, files = folder / LAST, epoch_files(folder)
    last_holds = None  # the whole epochs last.ckpt holds, read only where an epoch's file may be newer
    for epoch in sorted(files, reverse=True):
        if last.is_file():
            if last.samefile(files[epoch]):
                return last
            if last_holds is None:
                try:  # an earlier epoch's, or an epoch stopped mid-way (as many whole epochs as its file's)
                    last_holds = whole_epochs(last)
                except Exception:  # damaged: resuming from it names the damage, unless an epoch's file is whole
                    last_holds = -1
            if epoch <= last_holds:
                return last
        if _holds(files[epoch], epoch):
            return files[epoch]
    return last if last.is_file() else None


def prune_epoch_files(checkpoint_dir: Path, record: RunRecord, keep: int, monitor: str, mode: str) -> None:
    """Delete the per-epoch checkpoints that keep_checkpoints does not keep (the newest `keep` and the best)."""
    retention.prune(epoch_files(checkpoint_dir), record, keep, monitor, mode)


def drop_later(checkpoint_dir: Path, epochs: int) -> None:
    """Delete the per-epoch checkpoints of more than `epochs` epochs: a run resumed from an earlier one abandons
    them."""
    retention.drop_after(epoch_files(checkpoint_dir), epochs)


def best_epoch_file(checkpoint_dir: Path, record: RunRecord, monitor: str, mode: str) -> Path | None:
    """The per-epoch checkpoint of the best epoch by `monitor` among those with a file, or None."""
    files = epoch_files(checkpoint_dir)
    best = retention.best_saved_epoch(files, record.rows, monitor, mode)
    return None if best is None else files[best]


class ContractCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, saving at the end of the training epochs that `saves` (the run contract's
    saves_checkpoint, epochs counted from 1) names: every checkpoint_every-th and the last, as on every backend."""

    def __init__(self, *, saves: Callable[[int], bool], **kwargs):
        super().__init__(**kwargs)
        self.saves = saves

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        """The epoch's checkpoint, where the contract asks for one."""
        if self.saves(trainer.current_epoch + 1):
            super().on_train_epoch_end(trainer, pl_module)


class EpochNumberCheckpoint(ContractCheckpoint):
    """A ContractCheckpoint whose `{epoch}` in file names is the epoch counted from 1 (Lightning counts from
    0): epoch003.ckpt holds the weights after the third epoch, as on Keras and in the run's record. It remembers
    the step and file of its last save, for LastCheckpoint."""

    saved: tuple[int, str] | None = None  # (global step, file) of the last checkpoint it wrote

    def format_checkpoint_name(self, metrics, *args, **kwargs) -> str:
        """The file name of a checkpoint with these metrics, `epoch` counted from 1."""
        if "epoch" in metrics:
            metrics = {**metrics, "epoch": metrics["epoch"] + 1}
        return super().format_checkpoint_name(metrics, *args, **kwargs)

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        self.saved = (trainer.global_step, filepath)


class LastCheckpoint(ContractCheckpoint):
    """last.ckpt after every epoch that saves (a ContractCheckpoint without a monitor, run at the training epoch's
    end, after `epoch_file`: Lightning runs checkpoint callbacks last, in their order). When `epoch_file` has just
    written the same step's state, last.ckpt becomes a second name of that file (a hard link, which outlives the
    epoch file's removal) instead of a second write of the same bytes: a checkpoint of the ResNet-18 layout, its
    optimizer and weight average is ~130 MB, and writing it twice cost about 0.25 s an epoch on an H100 machine.
    Then, on the first process, `prune()` (keep_checkpoints' rule), once the epoch's row is in the run record."""

    def __init__(self, *, epoch_file: EpochNumberCheckpoint, prune: Callable[[], None], **kwargs):
        super().__init__(**kwargs)
        self.epoch_file, self.prune = epoch_file, prune

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        """last.ckpt where the contract saves, then the files keep_checkpoints does not keep removed."""
        super().on_train_epoch_end(trainer, pl_module)
        if self.saves(trainer.current_epoch + 1) and trainer.is_global_zero:
            self.prune()

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        same = self.epoch_file.saved is not None and self.epoch_file.saved[0] == trainer.global_step
        if not same:
            super()._save_checkpoint(trainer, filepath)
            return
        if trainer.is_global_zero:
            link = f"{filepath}.link-{os.getpid()}"
            os.link(self.epoch_file.saved[1], link)
            os.replace(link, filepath)  # a reader finds the previous last.ckpt or this one, whole
        trainer.strategy.barrier()
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
