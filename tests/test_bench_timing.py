"""How the benchmark times a window of steps: over the window, and at its median step, where each step's end is
marked (a scripted clock stands in for the host's or the GPU's, so that the figures are known)."""

from __future__ import annotations

import pytest
import torch

from hydrali.bench.report import Report, Row
from hydrali.bench.timing import STEP_WINDOWS, StepWindow, Timing, interleave, time_steps


class ScriptedClock:
    """Stamps at the times a test scripts: each stamp() takes the next one (and fails when none is left)."""

    def __init__(self, times: list[float]):
        self.times = iter(times)

    def stamp(self):
        return ScriptedStamp(next(self.times))


class ScriptedStamp:
    def __init__(self, at: float):
        self.at = at

    def seconds_since(self, earlier: "ScriptedStamp") -> float:
        return self.at - earlier.at


def test_the_median_step_is_over_every_timed_step_and_only_those():
    # 4 timed steps of 1, 1, 5 and 5 s, 10 images each: the median step is 3 s (with a stamp too few it would be
    # 1 or 5 s); the warm-up steps are not stamped
    clock = ScriptedClock([0.0, 1.0, 2.0, 7.0, 12.0])
    timing = time_steps(lambda: None, warmup=2, steps=4, images_per_step=10, stamp=clock.stamp)
    assert timing.median_step_images_per_s == pytest.approx(10 / 3)
    assert next(clock.times, None) is None  # every scripted stamp taken


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
    assert (
        report.table(["lightning"]).splitlines()[-1]
        == "| 2 lightning | a training loop | gpu | 90 | 110 | (baseline) |"
    )
    assert report.to_json({})["rows"][0]["median_step_images_per_s"] == 110.0


def test_a_measurement_that_fails_keeps_no_figures_of_its_earlier_repeats():
    class FailsSecond:
        """Times its first repeat, then fails."""

        def __init__(self):
            self.repeats = 0

        def once(self) -> Timing:
            self.repeats += 1
            if self.repeats == 2:
                raise RuntimeError("out of memory")
            return Timing(90.0, 100.0)

    report = Report()
    row, _ = report.add(Row("lightning", "train", "a training loop", "gpu"))
    interleave([(row, FailsSecond())], repeats=3)
    assert row.skipped.startswith("failed: RuntimeError: out of memory")
    json_row = report.to_json({})["rows"][0]
    assert json_row["images_per_s"] is None and json_row["median_step_images_per_s"] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events need a GPU")
def test_cuda_stamps_time_steps_on_the_gpu_and_leave_out_a_step_that_waited():
    import time

    from hydrali.bench.torch_loops import CudaStamp

    x = torch.randn(2048, 2048, device="cuda")
    calls = iter(range(100))

    def step():  # the same GPU work each step; the third timed step also waits 0.5 s on the host
        if next(calls) == 4:
            time.sleep(0.5)
        return x @ x

    timing = time_steps(
        step, warmup=2, steps=5, images_per_step=1, sync=lambda out: torch.cuda.synchronize(), stamp=CudaStamp
    )
    assert 1 / timing.median_step_images_per_s < 0.1  # the median step: GPU time of one matmul
    assert timing.median_step_images_per_s > 2 * timing.images_per_s  # the window includes the host's wait
