"""The steady-state images/s leaves each epoch's first steps out; the whole run's counts them."""

import time

import pytest

from hydrali.core.run.throughput import StepClock


def _epoch(clock: StepClock, slow_steps: int, fast_steps: int, images: int = 10) -> None:
    clock.epoch_start()
    for step in range(slow_steps + fast_steps):
        time.sleep(0.08 if step < slow_steps else 0.004)
        clock.step_end(images)
    clock.training_end()
    clock.training_end()  # validation start, then the epoch's end: counted once


def test_steady_state_leaves_out_each_epochs_warm_up_steps():
    clock = StepClock(warmup_steps=3)
    for _ in range(2):
        _epoch(clock, slow_steps=3, fast_steps=10)
    whole = 2 * 13 * 10 / clock.seconds
    assert clock.steady_images == 2 * 10 * 10, "the steps after the third of each epoch"
    assert clock.steady_images_per_second > 3 * whole, "the slow first steps are left out"
    assert clock.seconds >= 2 * (3 * 0.08 + 10 * 0.004)


def test_epochs_no_longer_than_their_warm_up_give_no_steady_figure():
    clock = StepClock(warmup_steps=5)
    _epoch(clock, slow_steps=0, fast_steps=5)
    assert clock.steady_images_per_second is None and clock.seconds > 0
    every = StepClock(warmup_steps=0)
    _epoch(every, slow_steps=0, fast_steps=4)
    assert every.steady_images == 40 and every.steady_images_per_second == pytest.approx(40 / every.steady_seconds)


def test_first_step_is_timed_from_the_first_epochs_start_once():
    clock = StepClock(warmup_steps=1)
    clock.epoch_start()
    assert clock.first_step_seconds is None
    clock.step_end(8)
    first = clock.first_step_seconds
    assert first is not None and first >= 0
    clock.step_end(8)
    clock.training_end()
    clock.epoch_start()
    clock.step_end(8)
    assert clock.first_step_seconds == first, "only the run's first step"
