"""Lightning callbacks of hydrali: the adapter to core's TrainingObserver (each epoch's record, throughput), the
epochs that validate (the run contract's validate_every), DALI's reader position in checkpoints, the stop on a
preemption signal, and a progress bar that counts epochs from 1 (as the run log, the summary and the checkpoint names
do). The checkpoint files are backends/lightning/checkpoints.py's."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from hydrali.core.distributed import gather
from hydrali.core.process.preemption import Preempted, PreemptionWatch
from hydrali.core.run.observer import TrainingObserver

log = logging.getLogger("hydrali")


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


class ValidationEpochs(L.Callback):
    """Validation after the epochs that `validates` (the run contract's, epochs counted from 1) names: every
    validate_every-th and the last, as on every backend (Lightning's own check_val_every_n_epoch skips the last
    epoch when it is not a multiple). Sets the Trainer's cadence for each epoch as it starts, and for the epoch
    training starts in (a resume in the middle of an epoch runs no on_train_epoch_start)."""

    def __init__(self, validates: Callable[[int], bool]):
        self.validates = validates

    def on_train_start(self, trainer, pl_module) -> None:
        self._set(trainer)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._set(trainer)

    def _set(self, trainer) -> None:
        epoch = trainer.current_epoch + 1
        # Lightning validates epoch e (from 1) when e % check_val_every_n_epoch == 0: 1 for yes, e + 1 for no
        trainer.check_val_every_n_epoch = 1 if self.validates(epoch) else epoch + 1


class ReaderPosition(L.Callback):
    """Where every process's DALI reader is, in every checkpoint, and where it goes on after a resume (at an epoch's
    end or in its middle): tells the training loader how many batches of the epoch were trained, gathers each
    process's position (backends/torch/loaders.py's ResumableDaliLoader) into the checkpoint, and on resume gives
    each process its own. Saved by a job of another number of processes, the positions are not used: the readers
    start afresh (one line says so)."""

    def __init__(self, loader, global_rank: int):
        self.loader, self.global_rank = loader, global_rank
        self._trainer = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.loader.trained = batch_idx + 1

    def state_dict(self) -> dict:
        """Every process's reader position, by global rank (a collective: every process saves the checkpoint)."""
        done = self._trainer is not None and self.loader.trained >= self._trainer.num_training_batches
        return {"positions": gather.gather_objects(self.loader.position(epoch_done=done))}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore this process's reader from its position in the checkpoint."""
        positions = state_dict.get("positions", [])
        world = self._trainer.world_size if self._trainer is not None else 1
        if len(positions) != world:
            log.warning(
                "the checkpoint holds the DALI readers of %d process(es), this job has %d: the readers start afresh",
                len(positions),
                world,
            )
            return
        self.loader.restore(positions[self.global_rank])


class StopOnSignal(L.Callback):
    """After a training step: when the job's processes agree that one of them received a preemption signal
    (core/process/preemption.py), save `path` (the run's last.ckpt) where the epoch is, then stop with Preempted.

    Not after an epoch's last step (Lightning counts a checkpoint saved there as the whole epoch, its validation
    not run): the epoch ends, and the run stops when the next one starts, its last.ckpt saved at the epoch's end.
    Nor in the middle of an accumulation of gradients. Without `mid_epoch` (a loader that cannot restore DALI's
    state), the run stops without saving and resumes at the start of the epoch, as on Keras."""

    def __init__(self, watch: PreemptionWatch, path: Path, mid_epoch: bool):
        self.watch, self.path, self.mid_epoch = watch, Path(path), mid_epoch
        self._cadence = None  # the steps after which the processes agree (core/process/preemption.CheckCadence)

    def on_train_start(self, trainer, pl_module) -> None:
        self.watch.reassert()  # after DALI's pipelines and the GPU's libraries are loaded
        self._cadence = self.watch.cadence(trainer.world_size)

    def _agreed(self, trainer) -> bool:
        return bool(trainer.strategy.reduce_boolean_decision(self.watch.requested(), all=False))

    def _stop(self, what: str):
        return Preempted(self.watch.received or self.watch.signals[0], what)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.watch.reassert()
        if trainer.current_epoch > 0 and self._agreed(trainer):  # a signal during the last epoch's end
            raise self._stop(
                f"stopped before epoch {trainer.current_epoch + 1}; the checkpoint of the epoch before "
                f"resumes ({self.path})"
            )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        due = self._cadence.after_batch(batch_idx, trainer.num_training_batches, trainer.accumulate_grad_batches)
        if not due or not self._agreed(trainer):
            return
        where = f"epoch {trainer.current_epoch + 1}, step {batch_idx + 1} of {trainer.num_training_batches}"
        if not self.mid_epoch:
            raise self._stop(
                f"stopped at {where}; the run resumes at the start of that epoch (pipeline.checkpointing"
                f"=false: DALI's reader state is not kept)"
            )
        partial = self.path.with_name(self.path.name + ".partial")  # a kill while writing leaves last.ckpt whole
        trainer.save_checkpoint(partial, weights_only=False)
        if trainer.is_global_zero:
            os.replace(partial, self.path)
        trainer.strategy.barrier("preempted")
        raise self._stop(f"checkpoint saved at {where} ({self.path})")


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
