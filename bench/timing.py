"""How the benchmark times things: over steps, after a warm-up, synchronized, repeated and interleaved.

A measurement is an object with `once()` -> Timing (one warmed-up, timed window: its images/s, and at its
median step where its steps are timed one by one) and optionally `close()`. `interleave` runs repeat 1 of every
measurement, then repeat 2 of every one, and so on, so that a drift of the (shared, noisy) machine hits every
measurement alike; each figure is then the median.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from hydrali.bench.report import Row
from hydrali.core.errors import first_line

log = logging.getLogger("hydrali")


@dataclass(frozen=True)
class Timing:
    """One timed window: images/s over all its steps, and at its median step (None where the steps were not
    timed one by one). A window slower than its median step had steps that waited, e.g. for a late batch."""

    images_per_s: float
    median_step_images_per_s: float | None = None


class Stamp(Protocol):
    """A point in time marked after a step; its clock is the one that runs the steps."""

    def seconds_since(self, earlier: "Stamp") -> float:
        """Seconds from `earlier` to this point (read once the window is synchronized)."""


class HostStamp:
    """A point on the host's clock: per-step times of steps that end when the host's call returns (the CPU)."""

    def __init__(self):
        self.at = time.perf_counter()

    def seconds_since(self, earlier: "HostStamp") -> float:
        """Seconds from `earlier` to this point."""
        return self.at - earlier.at


def median_step_rate(stamps: list, images_per_step: int) -> float | None:
    """Images/s at the median of the steps between consecutive `stamps` (None with fewer than two)."""
    if len(stamps) < 2:
        return None
    return images_per_step / statistics.median(b.seconds_since(a) for a, b in zip(stamps, stamps[1:]))


def time_steps(
    step: Callable[[], object],
    *,
    warmup: int,
    steps: int,
    images_per_step: int,
    sync: Callable[[object], None] = lambda out: None,
    stamp: Callable[[], Stamp] | None = None,
) -> Timing:
    """The Timing of `steps` calls of `step` after `warmup` calls; `sync(last output)` waits for the device
    before each reading of the clock (CUDA synchronize, a value fetched from the GPU). With `stamp`, each
    step's end is marked too, for the images/s at the median step."""
    out = None
    for _ in range(warmup):
        out = step()
    sync(out)
    stamps = [stamp()] if stamp else []
    start = time.perf_counter()
    for _ in range(steps):
        out = step()
        if stamp:
            stamps.append(stamp())
    sync(out)
    return Timing(steps * images_per_step / (time.perf_counter() - start), median_step_rate(stamps, images_per_step))


def interleave(measurements: Iterable[tuple[Row, object]], repeats: int) -> None:
    """Run every (row, measurement) pair `repeats` times, interleaved; each repeat's images/s (and median step's,
    where timed) joins its row.
    A measurement that fails records its one-line error in its row and is not run again."""
    pairs = list(measurements)
    failed: set[str] = set()
    for repeat in range(repeats):
        for row, measurement in pairs:
            if row.key in failed:
                continue
            try:
                timing = measurement.once()
            except Exception as err:  # noqa: BLE001 - one broken measurement must not lose the others
                row.skipped = f"failed: {type(err).__name__}: {first_line(err)[:300]}"
                row.repeats, row.step_repeats = [], []
                failed.add(row.key)
                log.exception("bench: %s failed", row.label)
                continue
            row.repeats.append(timing.images_per_s)
            step = timing.median_step_images_per_s
            if step is not None:
                row.step_repeats.append(step)
            log.info(
                "bench: repeat %d/%d  %-58s %10.1f images/s%s",
                repeat + 1,
                repeats,
                row.label,
                timing.images_per_s,
                f" ({step:.1f} at the median step)" if step is not None else "",
            )
    for _, measurement in pairs:
        close = getattr(measurement, "close", None)
        if close is not None:
            close()


# the timed window of each training run, by the key its step timer was given (see StepWindow)
STEP_WINDOWS: dict[str, Timing] = {}


class StepWindow:
    """The clock of a step timer inside a framework's training loop: call `step_end(sync, stamp)` after every
    training step; after `warmup` steps it synchronizes and starts the clock, after `warmup + steps` it
    synchronizes, stores the window's Timing in STEP_WINDOWS[key] and returns True (the caller then stops
    training). With `stamp`, each step of the window is marked too (its median step)."""

    def __init__(self, key: str, warmup: int, steps: int, images_per_step: int):
        self.key, self.warmup, self.steps, self.images_per_step = key, warmup, steps, images_per_step
        self.done = 0
        self._start: float | None = None
        self._stamps: list = []

    def step_end(self, sync: Callable[[], None], stamp: Callable[[], Stamp] | None = None) -> bool:
        """Count one finished step; True once the window is measured."""
        self.done += 1
        if self.done == self.warmup:
            sync()
            self._start = time.perf_counter()
            self._stamps = [stamp()] if stamp else []
        elif self._start is not None and self.done <= self.warmup + self.steps:
            if stamp:
                self._stamps.append(stamp())
            if self.done == self.warmup + self.steps:
                sync()
                STEP_WINDOWS[self.key] = Timing(
                    self.steps * self.images_per_step / (time.perf_counter() - self._start),
                    median_step_rate(self._stamps, self.images_per_step),
                )
                return True
        return False
