"""Where a run's wall time goes (issue 35, "Overhead in seconds, measured"): summary.json's wall_parts (start-up, data
check, build, first step, training, validation, tracking, other; core/run/wall_time.py) sum to its wall time, which
runs from the process's own start to the summary, and the end-of-run table shows them, on both backends."""

from __future__ import annotations

import re
import time

import pytest

from hydrali.core.run import wall_time
from hydrali.core.run.observer import TrainingObserver
from hydrali.core.run.summary import WALL_PART_LABELS
from tests.support.checks import read_summary
from tests.support.cli import start_cli
from tests.support.configs import KERAS_QUIET, TINY
from tests.support.observers import untracked_observer

pytestmark = pytest.mark.slow

PARTS = list(WALL_PART_LABELS)  # summary.json's wall_parts, in the table's order
SUM_TOLERANCE_S = 1.0  # the acceptance: the parts sum to the wall time within 1 s
# the wall time against the test's own clock from starting the command to reading the table's line: only Popen's
#   work before the fork (the process's start) and the summary's writing lie between them, 0.1 s when measured; the
#   command's Python start and imports before the runner is called take seconds
MEASURED_TOLERANCE_S = 1.0
RUN_TIMEOUT_S = 600
PYTEST_STARTUP_S = 0.2  # less than pytest's own start and imports take, more than a few lines of a test
WALL_LINE = re.compile(r"^wall time\s+: (?P<wall>[\d.]+) s = (?P<parts>.+)$", re.MULTILINE)


def check_wall_parts(summary: dict, stdout: str) -> dict:
    """The run's wall_parts are each >= 0 and sum to its wall time, the first step and the training took time, and
    the table's `wall time` line names every part; the parts."""
    parts = summary["wall_parts"]
    assert list(parts) == PARTS, parts
    assert all(seconds >= 0 for seconds in parts.values()), parts
    assert abs(sum(parts.values()) - summary["wall_seconds"]) <= SUM_TOLERANCE_S, (summary["wall_seconds"], parts)
    assert parts["first_step_s"] > 0 and parts["training_s"] > 0, parts
    assert parts["startup_s"] > 0 and parts["validation_s"] > 0, parts
    line = WALL_LINE.search(stdout)
    assert line is not None, stdout[-3000:]
    assert float(line["wall"]) == pytest.approx(summary["wall_seconds"], abs=0.05)
    expected = " + ".join(f"{parts[key]:.1f} {label}" for key, label in WALL_PART_LABELS.items())
    assert line["parts"] == expected
    return parts


@pytest.fixture(scope="module")
def both(trained_on_both):
    """The same experiment run by each backend (tests/support/both_backends.py), shared with other modules."""
    return trained_on_both


def test_the_wall_time_of_both_backends_runs_is_the_sum_of_its_parts(both):
    _, (lightning_out, lightning), (keras_out, keras) = both
    for out, summary in ((lightning_out, lightning), (keras_out, keras)):
        parts = check_wall_parts(summary, out.stdout)
        # the training steps the observer timed: the throughput's time, first step included
        assert parts["first_step_s"] + parts["training_s"] == pytest.approx(summary["train_seconds"], abs=0.01)


def test_the_wall_time_runs_from_the_commands_start_to_the_summary(tmp_path, data_dir):
    """One short run timed from outside: its wall time is what the test measured from starting the command to
    reading the table, so the command's own start-up (Python, imports) is counted."""
    out_dir = tmp_path / "run"
    args = ["backend=keras", "epochs=1", f"paths.data_dir={data_dir}", f"hydra.run.dir={out_dir}", *TINY]
    started = time.monotonic()
    proc = start_cli(*args, *KERAS_QUIET, cwd=tmp_path)
    lines, table_read = [], None
    for line in proc.stdout:  # stdout and stderr together, read as they come
        lines.append(line)
        if table_read is None and WALL_LINE.match(line.rstrip("\n")):
            table_read = time.monotonic() - started
    assert proc.wait(timeout=RUN_TIMEOUT_S) == 0, "".join(lines)[-3000:]
    assert table_read is not None, "".join(lines)[-3000:]
    summary = read_summary(out_dir)
    check_wall_parts(summary, "".join(lines))
    assert summary["wall_seconds"] == pytest.approx(table_read, abs=MEASURED_TOLERANCE_S)


def test_a_validation_in_an_epochs_middle_ends_at_the_next_training_step(tmp_path):
    observer = _observer(tmp_path)
    pause_s = 0.05
    observer.epoch_start(0)
    observer.step_start(0, lambda: 0.1)
    observer.step_end()
    observer.validation_start()
    time.sleep(pause_s)
    observer.step_start(1, lambda: 0.1)  # validation ended: what follows is training
    time.sleep(pause_s)
    observer.step_end()
    observer.epoch_end(0, {"train/loss": 1.0}, validated=True)
    validation = observer.fit_fields(start_epoch=0)["validation_seconds"]
    assert pause_s <= validation < 2 * pause_s


def test_only_a_process_that_exists_to_run_hydrali_counts_from_its_start():
    """The kernel's record of this process's (pytest's) start, on the clock the parts are timed with: what a run's
    wall time counts from within counted_from_process_start (the command line) or in a process started for it."""
    process_age = time.perf_counter() - wall_time.process_started()
    assert process_age > PYTEST_STARTUP_S
    assert time.perf_counter() - wall_time.run_started() < PYTEST_STARTUP_S, "a run called from Python: from now"
    assert time.perf_counter() - wall_time.run_started(whole_process=True) >= process_age
    with wall_time.counted_from_process_start():
        assert time.perf_counter() - wall_time.run_started() >= process_age, "the command's first run"
        assert time.perf_counter() - wall_time.run_started() < PYTEST_STARTUP_S, "a later job of its sweep"


def _observer(tmp_path) -> TrainingObserver:
    """An observer of 4 steps an epoch recording into a run record in tmp_path, tracking off."""
    return untracked_observer(tmp_path, epochs=1)
