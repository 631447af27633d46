"""End to end on the bundled digits with Lightning: learning, seeds, resume and MLflow tracking."""
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from core.runner import run
from tests.conftest import read_summary

pytestmark = pytest.mark.slow

QUIET = ["backend.trainer.enable_progress_bar=false", "backend.trainer.enable_model_summary=false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """One default run (10 epochs), tracked in MLflow: shared by the tests below."""
    from tests.conftest import compose_config

    root = tmp_path_factory.mktemp("trained")
    cfg = compose_config(QUIET, root, data_dir)
    value = run(cfg)
    return cfg, value, read_summary(cfg.paths.output_dir)


def test_the_default_run_learns_digits(trained):
    cfg, value, summary = trained
    assert summary["best"]["val/acc"] >= 0.9  # 0.978 in the README run; a margin for other CPUs
    assert value == summary["best"]["val/acc"]
    assert summary["epochs"] == 10 and len(summary["history"]) == 10
    assert summary["history"][-1]["train/loss"] < summary["history"][0]["train/loss"]
    assert summary["images_per_second"] > 0
    assert Path(summary["best_checkpoint"]).is_file()


def test_the_run_is_in_mlflow_with_params_metrics_and_config(trained):
    cfg, _, summary = trained
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    run_ = client.get_run(summary["mlflow_run_id"])
    assert run_.info.status == "FINISHED"
    params = run_.data.params
    assert params["optim.lr"] == str(cfg.optim.lr)
    assert params["data.batch_size"] == "64"
    assert params["plan/world_size"] == "1" and params["plan/global_batch"] == "64"
    # the effective lr logged equals the plan's: 0.1 x 64 / 32 (digits' ref_batch) = 0.2
    assert float(params["plan/effective_lr"]) == pytest.approx(summary["effective_lr"]) == pytest.approx(0.2)
    for name in ("train/loss", "val/loss", "val/acc"):
        history = client.get_metric_history(run_.info.run_id, name)
        assert [m.step for m in history] == list(range(10)), name
    acc = [m.value for m in client.get_metric_history(run_.info.run_id, "val/acc")]
    assert acc == pytest.approx([row["val/acc"] for row in summary["history"]])
    artifacts = {a.path for a in client.list_artifacts(run_.info.run_id, "config")}
    assert {"config/config.yaml", "config/overrides.txt"} <= artifacts
    assert client.list_artifacts(run_.info.run_id, "checkpoints"), "the best checkpoint is logged"


def _losses(make_cfg, tmp_path, seed: int, name: str) -> list[float]:
    out = tmp_path / name
    run(make_cfg(f"seed={seed}", "epochs=2", "tracking=none", *QUIET, output_dir=out))
    return [row["train/loss"] for row in read_summary(out)["history"]]


def test_the_same_seed_gives_the_same_losses_and_another_seed_does_not(make_cfg, tmp_path):
    first = _losses(make_cfg, tmp_path, 7, "a")
    again = _losses(make_cfg, tmp_path, 7, "b")
    other = _losses(make_cfg, tmp_path, 8, "c")
    assert len(first) == 2
    assert first == again
    assert all(x != y for x, y in zip(first, other))


def test_an_interrupted_run_resumes_at_the_next_epoch_and_ends_at_the_same_count(make_cfg, tmp_path):
    out = tmp_path / "run"
    stop = "+backend.callbacks.interrupt={_target_: tests.helpers.InterruptAtEpoch, epoch: 1}"
    with pytest.raises(SystemExit):  # Lightning ends the process after a graceful Ctrl+C shutdown
        run(make_cfg("epochs=3", stop, *QUIET, output_dir=out))
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert not (out / "summary.json").exists()
    interrupted_run = (out / "mlflow_run_id").read_text()

    run(make_cfg("epochs=3", "ckpt_path=last", *QUIET, output_dir=out))
    summary = read_summary(out)
    assert summary["first_epoch"] == 1, "continues at the second epoch"
    assert [row["epoch"] for row in summary["history"]] == [1, 2]
    assert summary["epochs"] == 3, "ends at the epoch count of an uninterrupted run"
    assert summary["mlflow_run_id"] == interrupted_run, "the MLflow run is continued, not duplicated"
    client = MlflowClient(tracking_uri=make_cfg().tracking.uri)
    assert [m.step for m in client.get_metric_history(interrupted_run, "val/acc")] == [0, 1, 2]
