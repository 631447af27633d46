"""The benchmark's timed training runs (hydrali.core.bench_training), on this machine's CPU, on both backends:
a run through hydrali itself that trains its warm-up and timed steps, then stops, and gives the timed window's
images/s. (hydrali-bench's training sections need a GPU; these are the parts of them that do not.)"""
from __future__ import annotations

import json

import pytest

from hydrali.core.bench_run import plain
from hydrali.core.bench_training import HydraliTraining
from hydrali.core.errors import HydraliError
from tests.conftest import SMALL_NET

pytestmark = pytest.mark.slow
BATCH = 8


def history(run_dir) -> list[dict]:
    """The run record's rows, as the run wrote them."""
    return json.loads((run_dir / "history.json").read_text())["history"]


@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_a_timed_run_trains_its_warm_up_and_timed_steps_then_stops(backend, make_cfg, tmp_path):
    cfg = make_cfg(f"backend={backend}", "tracking.enabled=false", *SMALL_NET, f"data.batch_size={BATCH}")
    training = HydraliTraining(plain(cfg), backend, str(tmp_path / "runs"), warmup=2, steps=3)

    first, second = training.once(), training.once()

    assert first > 0 and second > 0
    for repeat in (1, 2):   # each repeat is a run of its own, stopped within its first epoch after 2 + 3 steps
        rows = history(tmp_path / "runs" / f"{backend}-r{repeat}")
        assert len(rows) == 1 and rows[0]["train/images"] == (2 + 3) * BATCH


def test_an_epoch_shorter_than_the_window_is_one_error_naming_the_settings(make_cfg, tmp_path):
    cfg = make_cfg("tracking.enabled=false", *SMALL_NET, f"data.batch_size={BATCH}")
    training = HydraliTraining(plain(cfg), "lightning", str(tmp_path / "runs"), warmup=2, steps=10_000)

    with pytest.raises(HydraliError, match=r"bench\.train\.warmup / bench\.train\.steps"):
        training.once()
