"""A run resumed at an epoch's end without DALI's saved reader state (pipeline.checkpointing=false on Lightning; every
Keras resume) reads new batches, not the first epochs' again: its pipelines are seeded for the epoch it resumes at."""

import json

import pytest

from hydrali.core.run.runner import run
from tests.support.configs import LIGHTNING_QUIET, TINY, with_plugin_callback

pytestmark = pytest.mark.slow


def test_a_run_resumed_without_dalis_reader_state_does_not_replay_its_first_epoch(make_cfg, tmp_path):
    record, out = tmp_path / "batches.jsonl", tmp_path / "run"
    args = [
        *TINY,
        *LIGHTNING_QUIET,
        "epochs=2",
        "pipeline.checkpointing=false",
        "data.verify=off",
        "tracking=none",
        with_plugin_callback("record", "RecordBatches", path=str(record)),
    ]
    stop = "+backend.callbacks.interrupt={_target_: tests.support.plugins.InterruptAtEpoch, epoch: 1}"
    with pytest.raises(KeyboardInterrupt):
        run(make_cfg(*args, stop, output_dir=out))
    run(make_cfg(*args, "ckpt_path=last", output_dir=out))
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    first, resumed = ([row["images"] for row in rows if row["epoch"] == epoch] for epoch in (0, 1))
    assert len(first) == len(resumed) > 1, "the first epoch before the interruption, the second after the resume"
    # a fresh pipeline with the first epoch's seed would make the first epoch's batches again, in the same order
    assert not set(first) & set(resumed), "a batch of the first epoch trained again after the resume"
