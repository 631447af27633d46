"""How the benchmark times a window of steps: over the window, and at its median step, where each step's end is
marked (a scripted clock stands in for the host's or the GPU's, so that the figures are known)."""
from __future__ import annotations

import pytest

from hydrali.core.bench_report import Report, Row
from hydrali.core.bench_timing import STEP_WINDOWS, StepWindow, Timing, interleave, time_steps


class ScriptedClock:
    """Stamps at the times a test scripts: each stamp() takes the next one."""

    def __init__(self, times: list[float]):
        self.times = iter(times)

    def stamp(self):
        return ScriptedStamp(next(self.times))


class ScriptedStamp:
    def __init__(self, at: float):
        self.at = at

    def seconds_since(self, earlier: "ScriptedStamp") -> float:
        return self.at - earlier.at


def test_the_median_step_leaves_out_a_step_that_waited():
    # steps of 1, 1, 5 and 1 s of 10 images each: the median step is 1 s (10 images/s), whatever the window took
    clock = ScriptedClock([0.0, 1.0, 2.0, 7.0, 8.0])
    timing = time_steps(lambda: None, warmup=2, steps=4, images_per_step=10, stamp=clock.stamp)
    assert timing.median_step_images_per_s == pytest.approx(10.0)
    assert timing.images_per_s > 0


def test_a_window_without_stamps_has_no_median_step():
    assert time_steps(lambda: None, warmup=1, steps=3, images_per_step=10).median_step_images_per_s is None


def test_a_step_window_marks_only_its_timed_steps_and_stops_after_them():
    # 2 warm-up steps, then 3 timed steps of 2, 4 and 2 s of 8 images: the median step is 2 s (4 images/s)
    clock = ScriptedClock([10.0, 12.0, 16.0, 18.0])
    window = StepWindow("scripted", warmup=2, steps=3, images_per_step=8)
    stopped = [window.step_end(lambda: None, clock.stamp) for _ in range(5)]
    assert stopped == [False, False, False, False, True]
    timing = STEP_WINDOWS.pop("scripted")
    assert timing.median_step_images_per_s == pytest.approx(4.0)


class Replayed:
    """A measurement whose repeats give the Timings it was handed."""

    def __init__(self, *timings: Timing):
        self.timings = iter(timings)

    def once(self) -> Timing:
        return next(self.timings)


def test_a_row_keeps_each_repeats_median_step_and_the_table_shows_their_median():
    report = Report()
    row, _ = report.add(Row("lightning", "train", "a training loop", "gpu"))
    interleave([(row, Replayed(Timing(90.0, 100.0), Timing(80.0, 120.0), Timing(95.0, 110.0)))], repeats=3)
    assert row.repeats == [90.0, 80.0, 95.0] and row.step_repeats == [100.0, 120.0, 110.0]
    assert report.table(["lightning"]).splitlines()[-1] == "| 2 lightning | a training loop | gpu | 90 | 110 | (baseline) |"
    assert report.to_json({})["rows"][0]["median_step_images_per_s"] == 110.0
