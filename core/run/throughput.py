"""Training throughput, measured the same way on every backend: the whole run's and the steady state's.

Whole run: the images of every training step over the time of the training part of each epoch (from its
start to its validation or its end). Steady state: the same with each epoch's first `warmup_steps` steps
left out (data loaders filling, kernels chosen, the switch back from validation), timed from the end of
the epoch's warm-up step to the end of its last training step: the figure a benchmark reports. First
step: the time from the first epoch's start to the end of its first step (loaders starting, and with
backend.compile the compile warm-up), reported on its own. Backends call the clock from their own
callbacks, each step counting the plan's global batch; timestamps are taken at step ends without a
device sync.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class StepClock:
    """Counts training steps and images and times them, whole and in steady state."""

    warmup_steps: int
    seconds: float = 0.0  # training time, every step included
    steady_seconds: float = 0.0
    steady_images: int = 0
    first_step_seconds: float | None = None  # the first epoch's start to the end of its first step
    started: float | None = None  # time.perf_counter() at the first epoch's start
    _epoch_start: float | None = field(default=None, repr=False)
    _steps: int = field(default=0, repr=False)
    _steady_start: float | None = field(default=None, repr=False)
    _last_step_end: float | None = field(default=None, repr=False)
    _pending_images: int = field(default=0, repr=False)

    def epoch_start(self) -> None:
        """The training part of an epoch starts."""
        self._epoch_start, self._steps, self._steady_start, self._last_step_end = time.perf_counter(), 0, None, None
        self._pending_images = 0
        if self.started is None:
            self.started = self._epoch_start
        if self.warmup_steps == 0:
            self._steady_start = self._epoch_start

    def step_end(self, images: int) -> None:
        """A training step of `images` images (all replicas) ended."""
        now = time.perf_counter()
        self._steps += 1
        if self.first_step_seconds is None and self._steps == 1 and self._epoch_start is not None:
            self.first_step_seconds = now - self._epoch_start
        if self._steady_start is not None:
            self._pending_images += images
            self._last_step_end = now
        elif self._steps == self.warmup_steps:
            self._steady_start = now

    def training_end(self) -> None:
        """The training part of the epoch ended (validation starts, or the epoch ends); called twice, counts once."""
        if self._epoch_start is None:
            return
        self.seconds += time.perf_counter() - self._epoch_start
        if self._steady_start is not None and self._last_step_end is not None:
            self.steady_seconds += self._last_step_end - self._steady_start
            self.steady_images += self._pending_images
        self._epoch_start = None

    @property
    def steady_images_per_second(self) -> float | None:
        """Images per second in steady state; None when no epoch ran past its warm-up steps."""
        return self.steady_images / self.steady_seconds if self.steady_seconds > 0 else None

    def fit_fields(self) -> dict:
        """What a backend's FitResult takes from this clock: train_seconds, steady_images_per_second,
        first_step_seconds and training_started."""
        return {
            "train_seconds": self.seconds,
            "steady_images_per_second": self.steady_images_per_second,
            "first_step_seconds": self.first_step_seconds,
            "training_started": self.started,
        }
