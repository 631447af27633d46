"""Fine-tuning on both backends, recorded by a callback in the training process: with model.freeze=backbone only the
head's weights move, the backbone's weights and BatchNorm statistics stay; with optim.backbone_lr_mult=0 the
backbone's weights stay while its BatchNorm statistics follow the data."""

from __future__ import annotations

import json

import pytest

from hydrali.core.run.runner import run
from tests.support.checks import fails_with
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY, compose_config, with_plugin_callback

pytestmark = pytest.mark.slow

RECORDER = {"lightning": "RecordChangedWeights", "keras": "KerasRecordChangedWeights"}
QUIET = {"lightning": LIGHTNING_QUIET, "keras": KERAS_QUIET}
HEAD = {"lightning": ["head.2.bias", "head.2.weight"], "keras": ["dense/bias", "dense/kernel"]}  # the last Linear/Dense
STATISTICS = {"lightning": "running_mean", "keras": "moving_mean"}


def _changed_weights(tmp_path, data_dir, backend: str, *extra: str) -> dict:
    """The weights an epoch of `backend` changed and kept, recorded by a callback of the run; the run in this
    process (what is checked is what trains, not the command line)."""
    record = tmp_path / f"{backend}.json"
    if backend == "keras":  # Keras names layers by a count kept per process: from 0, as in a run of its own
        import keras

        keras.backend.clear_session()
    overrides = [
        "epochs=1",
        *TINY,
        f"backend={backend}",
        *QUIET[backend],
        *extra,
        with_plugin_callback("weights", RECORDER[backend], path=str(record)),
        "tracking=none",
    ]
    run(compose_config(overrides, tmp_path, data_dir, tmp_path / backend))
    return json.loads(record.read_text())


BACKENDS = ["lightning", pytest.param("keras", marks=pytest.mark.keras)]  # keras: trains in this process


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_frozen_backbone_keeps_its_weights_and_statistics_and_the_head_trains(tmp_path, data_dir, backend):
    weights = _changed_weights(tmp_path, data_dir, backend, "model.freeze=backbone")
    assert weights["changed"] == HEAD[backend]
    assert any(STATISTICS[backend] in name for name in weights["kept"]), "BatchNorm statistics are recorded"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backbone_at_lr_0_keeps_its_weights_while_its_statistics_and_the_head_train(tmp_path, data_dir, backend):
    weights = _changed_weights(tmp_path, data_dir, backend, "optim.backbone_lr_mult=0")
    moved = [name for name in weights["changed"] if name not in HEAD[backend]]
    assert set(HEAD[backend]) < set(weights["changed"])
    assert moved and all(any(s in name for s in ("running_", "moving_", "num_batches")) for name in moved), moved


def test_without_freeze_the_backbone_and_its_statistics_train(tmp_path, data_dir):
    weights = _changed_weights(tmp_path, data_dir, "lightning")
    assert set(HEAD["lightning"]) < set(weights["changed"])
    assert any("running_mean" in name for name in weights["changed"])


def test_freeze_takes_its_choices_only(tmp_path, data_dir):
    fails_with(
        run_cli("model.freeze=head", f"paths.data_dir={data_dir}", cwd=tmp_path),
        "model.freeze=head: pass null (every layer trains) or backbone",
    )
    fails_with(  # detection's SSD has several heads: its spec does not declare fine-tuning yet
        run_cli("task=detection", "model.freeze=backbone", f"paths.data_dir={data_dir}", cwd=tmp_path),
        "model.freeze=backbone is not there yet for task=detection",
    )


def test_resuming_with_another_backbone_lr_mult_or_a_weight_average_is_refused_naming_it(tmp_path, data_dir):
    # the optimizer's parameter groups, and the lrs a checkpoint restores, follow it
    run_dir = tmp_path / "run"
    run(compose_config(["epochs=1", *TINY, *LIGHTNING_QUIET, "tracking=none"], tmp_path, data_dir, run_dir))  # here
    args = [*TINY, *LIGHTNING_QUIET, "tracking=none", f"paths.data_dir={data_dir}", f"hydra.run.dir={run_dir}"]
    fails_with(
        run_cli("epochs=2", "ckpt_path=last", "optim.backbone_lr_mult=0.1", *args, cwd=tmp_path),
        "backbone_lr_mult",
    )
    # a weight average switched on adds to the checkpoint's state: refused the same way (issue 35)
    fails_with(run_cli("epochs=2", "ckpt_path=last", "optim.ema_decay=0.9", *args, cwd=tmp_path), "ema")
