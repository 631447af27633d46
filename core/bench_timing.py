"""How the benchmark times things: over steps, after a warm-up, synchronized, repeated and interleaved.

A measurement is an object with `once() -> images/s` (one warmed-up, timed window) and optionally
`close()`. `interleave` runs repeat 1 of every measurement, then repeat 2 of every one, and so on, so that
a drift of the (shared, noisy) machine hits every measurement alike; each figure is then the median.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

from hydrali.core.bench_report import Row
from hydrali.core.errors import first_line

log = logging.getLogger("hydrali")


def time_steps(step: Callable[[], object], *, warmup: int, steps: int, images_per_step: int,
               sync: Callable[[object], None] = lambda out: None) -> float:
    """Images/s of `steps` calls of `step` after `warmup` calls; `sync(last output)` waits for the device
    before each reading of the clock (CUDA synchronize, a value fetched from the GPU)."""
    out = None
    for _ in range(warmup):
        out = step()
    sync(out)
    start = time.perf_counter()
    for _ in range(steps):
        out = step()
    sync(out)
    return steps * images_per_step / (time.perf_counter() - start)


def interleave(measurements: Iterable[tuple[Row, object]], repeats: int) -> None:
    """Run every (row, measurement) pair `repeats` times, interleaved; each repeat's images/s joins its row.
    A measurement that fails records its one-line error in its row and is not run again."""
    pairs = list(measurements)
    failed: set[str] = set()
    for repeat in range(repeats):
        for row, measurement in pairs:
            if row.key in failed:
                continue
            try:
                value = measurement.once()
            except Exception as err:   # noqa: BLE001 - one broken measurement must not lose the others
                row.skipped, row.repeats = f"failed: {type(err).__name__}: {first_line(err)[:300]}", []
                failed.add(row.key)
                log.exception("bench: %s failed", row.label)
                continue
            row.repeats.append(float(value))
            log.info("bench: repeat %d/%d  %-58s %10.1f images/s", repeat + 1, repeats, row.label, value)
    for _, measurement in pairs:
        close = getattr(measurement, "close", None)
        if close is not None:
            close()


# images/s of the timed window of each training run, by the key its step timer was given (see StepWindow)
STEP_WINDOWS: dict[str, float] = {}


class StepWindow:
    """The clock of a step timer inside a framework's training loop: call `step_end(sync)` after every
    training step; after `warmup` steps it synchronizes and starts the clock, after `warmup + steps` it
    synchronizes, stores images/s in STEP_WINDOWS[key] and returns True (the caller then stops training)."""

    def __init__(self, key: str, warmup: int, steps: int, images_per_step: int):
        self.key, self.warmup, self.steps, self.images_per_step = key, warmup, steps, images_per_step
        self.done = 0
        self._start: float | None = None

    def step_end(self, sync: Callable[[], None]) -> bool:
        """Count one finished step; True once the window is measured."""
        self.done += 1
        if self.done == self.warmup:
            sync()
            self._start = time.perf_counter()
        elif self.done == self.warmup + self.steps and self._start is not None:
            sync()
            STEP_WINDOWS[self.key] = self.steps * self.images_per_step / (time.perf_counter() - self._start)
            return True
        return False
