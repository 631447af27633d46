"""What both backends report while training, in one vocabulary: each framework's callbacks are thin adapters
that call a `TrainingObserver` at the same points (epoch start, step start and end, validation start, epoch end),
and the observer turns them into the run record's rows, the throughput clock and the FitResult's fields.

So the two backends agree by construction on what an epoch's row holds (train/ metrics, val/ metrics only when the
epoch validated, train/images = batches x the images all replicas train on per batch, lr/first and lr/last: the lr
of the epoch's first and last training steps), on how throughput is timed (core/run/throughput.py) and on how long
validation takes: from its start to the next training step (a validation in an epoch's middle) or the epoch's end.
"""

from __future__ import annotations

import time
from typing import Callable

from hydrali.core.run.record import RunRecord
from hydrali.core.run.throughput import StepClock


class TrainingObserver:
    """Records each epoch of a run into its RunRecord and times its training steps."""

    def __init__(self, record: RunRecord, *, images_per_batch: int, steps_per_epoch: int, warmup_steps: int):
        self.record = record
        self.images_per_batch = images_per_batch  # all replicas' images per training batch
        self.steps_per_epoch = steps_per_epoch
        self.clock = StepClock(warmup_steps)
        self.first_epoch: int | None = None  # the first epoch this invocation trained (0-based)
        self.last_epoch: int | None = None  # the last epoch it recorded
        self._epoch: int | None = None  # the epoch whose start it saw
        self._steps = 0
        self._lrs: dict[str, float] = {}
        self.validation_seconds = 0.0  # every validation's time, this invocation
        self._validating_since: float | None = None  # time.perf_counter() at the start of the validation running

    def epoch_start(self, epoch: int) -> None:
        """The training part of epoch `epoch` (0-based) starts."""
        if self.first_epoch is None:
            self.first_epoch = epoch
            self.record.start(epoch + 1)
        self._epoch, self._steps, self._lrs = epoch, 0, {}
        self.clock.epoch_start()

    def started(self, epoch: int) -> bool:
        """Whether this observer saw the start of epoch `epoch` (not when training resumed in its middle)."""
        return self._epoch == epoch

    def partial_epoch(self) -> dict:
        """The epoch in progress (its number, steps observed and lrs read), for a checkpoint saved in its middle."""
        return {"epoch": self._epoch, "steps": self._steps, "lrs": dict(self._lrs)}

    def epoch_resumed(self, epoch: int, partial: dict) -> None:
        """Training resumed in the middle of epoch `epoch` from a checkpoint that held `partial` (partial_epoch)."""
        self.epoch_start(epoch)
        if partial.get("epoch") == epoch:
            self._steps, self._lrs = int(partial["steps"]), dict(partial["lrs"])

    def step_start(self, step: int, lr: Callable[[], float], steps_in_epoch: float | None = None) -> None:
        """Training step `step` of the epoch starts; `lr()` reads the lr it uses (read at the first and last step
        only: on some frameworks reading it waits for the device). `steps_in_epoch`: the steps this epoch runs when
        the framework ends it before the plan's (e.g. Lightning's limit_train_batches)."""
        self._validation_end()  # a validation in the epoch's middle
        last = min(self.steps_per_epoch, steps_in_epoch or self.steps_per_epoch) - 1
        if step == 0:
            self._lrs["lr/first"] = float(lr())
        if step == last:
            self._lrs["lr/last"] = float(lr())

    def step_end(self) -> None:
        """A training step of the plan's global batch ended (every training batch is whole: the epoch steps)."""
        self._steps += 1
        self.clock.step_end(self.images_per_batch)

    def validation_start(self) -> None:
        """The epoch's training part ended and its validation starts."""
        self.clock.training_end()
        self._validating_since = time.perf_counter()

    def _validation_end(self) -> None:
        """The validation running, if any, ended."""
        if self._validating_since is not None:
            self.validation_seconds += time.perf_counter() - self._validating_since
            self._validating_since = None

    def epoch_end(self, epoch: int, metrics: dict[str, float], validated: bool) -> None:
        """Epoch `epoch` ended with `metrics` (hydrali's names: train/..., val/...); val/ metrics are kept only when
        the epoch validated. An epoch whose start was not seen (finished before a resume) is not recorded."""
        self.clock.training_end()
        self._validation_end()
        if self._epoch != epoch:
            return
        prefixes = ("train/", "val/") if validated else ("train/",)
        row = {name: float(value) for name, value in metrics.items() if name.startswith(prefixes)}
        row["train/images"] = self._steps * self.images_per_batch
        self.record.add(epoch + 1, {**row, **self._lrs})  # the record counts epochs from 1
        self.last_epoch = epoch

    def fit_fields(self, start_epoch: int) -> dict:
        """What a FitResult takes from what was observed: first_epoch, epochs_completed (`start_epoch` when no
        epoch ran), validation_seconds, and the clock's timings."""
        first = self.first_epoch if self.first_epoch is not None else start_epoch
        completed = self.last_epoch + 1 if self.last_epoch is not None else start_epoch
        return {
            "first_epoch": first,
            "epochs_completed": completed,
            "validation_seconds": self.validation_seconds,
            **self.clock.fit_fields(),
        }
