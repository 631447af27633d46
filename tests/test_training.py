"""End to end on the bundled digits with Lightning: learning, seeds, resume and MLflow tracking."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hydrali.core.run.runner import run
from tests.support.checks import (
    check_each_val_image_counted_once,
    check_resume_keeps_the_record,
    check_validation_every_second_epoch,
    read_summary,
)
from tests.support.configs import LIGHTNING_QUIET, SMALL_NET, compose_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """One default run (10 epochs), tracked in MLflow: shared by the tests below."""
    root = tmp_path_factory.mktemp("trained")
    cfg = compose_config(LIGHTNING_QUIET, root, data_dir)
    value = run(cfg)
    return cfg, value, read_summary(cfg.paths.output_dir)


def test_the_default_run_learns_digits(trained):
    cfg, value, summary = trained
    assert summary["best"]["val/acc"] >= 0.9  # 0.967 in the README run; a margin for other CPUs
    assert value == summary["best"]["val/acc"]
    assert summary["epochs"] == 10 and len(summary["history"]) == 10
    assert summary["history"][-1]["train/loss"] < summary["history"][0]["train/loss"]
    assert summary["images_per_second"] > 0
    assert Path(summary["best_checkpoint"]).is_file()


def test_each_epoch_trains_whole_batches_and_scores_each_val_image_once(trained):
    _, _, summary = trained
    # 1437 training images, batch 64: 22 whole batches; 360 val images: 5 batches and 40 images
    assert summary["steps_per_epoch"] == 22
    assert [row["train/images"] for row in summary["history"]] == [22 * 64] * 10
    check_each_val_image_counted_once(summary)


def test_the_run_is_in_mlflow_with_params_metrics_and_config(trained):
    cfg, _, summary = trained
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    run_ = client.get_run(summary["mlflow_run_id"])
    assert run_.info.status == "FINISHED"
    params = run_.data.params
    assert params["optim.lr"] == str(cfg.optim.lr)
    assert params["data.batch_size"] == "64"
    assert params["plan/world_size"] == "1" and params["plan/global_batch"] == "64"
    # the effective lr logged equals the plan's: 0.1 x 64 / 32 (small_resnet's optimizer, optim=sgd_small) = 0.2
    assert float(params["plan/effective_lr"]) == pytest.approx(summary["effective_lr"]) == pytest.approx(0.2)
    for name in ("train/loss", "val/loss", "val/acc"):
        history = client.get_metric_history(run_.info.run_id, name)
        assert [m.step for m in history] == list(range(1, 11)), name
    acc = [m.value for m in client.get_metric_history(run_.info.run_id, "val/acc")]
    assert acc == pytest.approx([row["val/acc"] for row in summary["history"]])
    artifacts = {a.path for a in client.list_artifacts(run_.info.run_id, "config")}
    assert {"config/config.yaml", "config/overrides.txt"} <= artifacts
    assert client.list_artifacts(run_.info.run_id, "checkpoints"), "the best checkpoint is logged"


def _losses(make_cfg, tmp_path, seed: int, name: str) -> list[float]:
    out = tmp_path / name
    run(make_cfg(f"seed={seed}", "epochs=2", "tracking=none", *SMALL_NET, *LIGHTNING_QUIET, output_dir=out))
    return [row["train/loss"] for row in read_summary(out)["history"]]


def test_the_same_seed_gives_the_same_losses_and_another_seed_does_not(make_cfg, tmp_path):
    first = _losses(make_cfg, tmp_path, 7, "a")
    again = _losses(make_cfg, tmp_path, 7, "b")
    other = _losses(make_cfg, tmp_path, 8, "c")
    assert len(first) == 2
    assert first == again
    assert all(x != y for x, y in zip(first, other))


def test_an_interrupted_run_resumes_with_its_whole_record(make_cfg, tmp_path):
    check_resume_keeps_the_record(make_cfg, tmp_path, LIGHTNING_QUIET, "tests.support.plugins.InterruptAtEpoch")


def test_epochs_without_validation_have_no_val_metrics(make_cfg, tmp_path):
    check_validation_every_second_epoch(make_cfg, tmp_path, [*LIGHTNING_QUIET, "validate_every=2"])
