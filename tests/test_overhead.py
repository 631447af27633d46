"""Where a run's wall time goes (issue 35, "Overhead in seconds, measured"): summary.json's wall_parts (start-up, data
check, build, first step, training, validation, tracking, other; core/run/wall_time.py) sum to its wall time, which
runs from the process's own start to the summary, and the end-of-run table shows them, on both backends. The sum
holds by construction (`other` is what the rest leave); what a user relies on, that each part says where the time
went, is checked from outside: against the test's own clock and the framework's callbacks' view of a run."""

from __future__ import annotations

import json
import re
import time

import pytest

from hydrali.core.run import wall_time
from hydrali.core.run.observer import TrainingObserver
from hydrali.core.run.summary import WALL_PART_LABELS
from tests.support.checks import read_summary
from tests.support.cli import start_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY, with_plugin_callback
from tests.support.observers import untracked_observer

pytestmark = pytest.mark.slow

PARTS = list(WALL_PART_LABELS)  # summary.json's wall_parts, in the table's order
SUM_TOLERANCE_S = 1.0  # the acceptance: the parts sum to the wall time within 1 s
# the wall time against the test's own clock from starting the command to reading the table's line: only Popen's
#   work before the fork (the process's start) and the summary's writing lie between them, 0.1 s when measured; the
#   command's Python start and imports before the runner is called take seconds
MEASURED_TOLERANCE_S = 1.0
RUN_TIMEOUT_S = 600
# a framework's callbacks of one event run one after another: the test's callback and hydrali's see it within this
EVENT_TOLERANCE_S = 0.02
# before the first epoch, the time of the run's plan, resume point and `auto` settings: `other`'s, on no part's clock
#   (0.03 s when measured on 2 cores, from starting the command); a start-up, data check or build left untimed is more
UNCLAIMED_BEFORE_TRAINING_S = 0.25
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


@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_each_part_is_where_the_time_went_as_seen_from_outside(tmp_path, data_dir, backend):
    """One short run timed from outside: its wall time is what the test measured from starting the command to
    reading the table, so the command's own start-up (Python, imports) is counted; and each part holds the time of
    what it names, as a callback of the framework (tests/support/plugins.py: RecordTrainingTimes) saw its training
    steps and validations happen, and as the test's own clock saw the time before training: a part timed wrong shows
    here even though `other` (what the rest leave) keeps the sum."""
    out_dir, times = tmp_path / "run", tmp_path / "times.jsonl"
    args = [f"backend={backend}", "epochs=2", "tracking=none", f"paths.data_dir={data_dir}", *TINY]
    recorder = with_plugin_callback("times", "RecordTrainingTimes", path=str(times), framework=backend)
    quiet = KERAS_QUIET if backend == "keras" else LIGHTNING_QUIET
    started_at, started = time.time(), time.monotonic()
    proc = start_cli(*args, f"hydra.run.dir={out_dir}", recorder, *quiet, cwd=tmp_path)
    lines, table_read = [], None
    for line in proc.stdout:  # stdout and stderr together, read as they come
        lines.append(line)
        if table_read is None and WALL_LINE.match(line.rstrip("\n")):
            table_read = time.monotonic() - started
    assert proc.wait(timeout=RUN_TIMEOUT_S) == 0, "".join(lines)[-3000:]
    assert table_read is not None, "".join(lines)[-3000:]
    summary = read_summary(out_dir)
    parts = check_wall_parts(summary, "".join(lines))
    assert summary["wall_seconds"] == pytest.approx(table_read, abs=MEASURED_TOLERANCE_S)

    epochs = _epochs_seen(times)
    assert len(epochs) == 2 and all(epoch["validation_start"] for epoch in epochs), epochs
    first = epochs[0]
    # the first step: from the first epoch's start to the end of its first step, as the callback saw them
    _within(
        parts["first_step_s"],
        first["step_start"][0] - first["epoch_start"],
        first["step_end"][0] - first["epoch_start"],
    )
    # training: each epoch's start to its last step's end, at most to its validation's start
    _within(
        parts["first_step_s"] + parts["training_s"],
        sum(epoch["step_end"][-1] - epoch["epoch_start"] for epoch in epochs),
        sum(epoch["validation_start"] - epoch["epoch_start"] for epoch in epochs),
    )
    # validation: each validation's start to its end, at most to its epoch's end
    _within(
        parts["validation_s"],
        sum(epoch["validation_end"] - epoch["validation_start"] for epoch in epochs),
        sum(epoch["epoch_end"] - epoch["validation_start"] for epoch in epochs),
    )
    # before training: start-up, data check and build fit in the time from the command's start to the first epoch's,
    # and leave at most UNCLAIMED_BEFORE_TRAINING_S of it to no part but `other` (the plan, the `auto` settings)
    before_training = first["epoch_start"] - started_at
    claimed = parts["startup_s"] + parts["data_check_s"] + parts["build_s"]
    assert claimed <= before_training + EVENT_TOLERANCE_S, (before_training, parts)
    assert before_training - claimed - parts["tracking_s"] <= UNCLAIMED_BEFORE_TRAINING_S, (before_training, parts)


def _epochs_seen(path) -> list[dict]:
    """The epochs RecordTrainingTimes saw, in order: each its epoch_start, validation_start, validation_end and
    epoch_end times (None where not seen) and the lists of its steps' step_start and step_end times."""
    epochs = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "epoch_start":
            epochs.append({"validation_start": None, "step_start": [], "step_end": []})
        if event["event"] in ("step_start", "step_end"):
            epochs[-1][event["event"]].append(event["time"])
        else:
            epochs[-1][event["event"]] = event["time"]
    return epochs


def _within(seconds: float, at_least: float, at_most: float) -> None:
    """`seconds` (a part) lies between what the callback saw at least and at most, to EVENT_TOLERANCE_S."""
    assert at_least - EVENT_TOLERANCE_S <= seconds <= at_most + EVENT_TOLERANCE_S, (at_least, seconds, at_most)


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
