"""Several processes through the real launchers: Lightning DDP (CPU, gloo) and a Hydra -m sweep."""
import re

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import check_each_val_image_counted_once, read_summary, run_cli

pytestmark = pytest.mark.slow
QUIET = ["backend.trainer.enable_progress_bar=false", "backend.trainer.enable_model_summary=false"]
TINY = ["pipeline=light", "model.widths=[8,16,32]", "data.image_size=16"]   # a narrow network on 16 x 16 images


def test_ddp_with_two_processes_reads_two_shards_and_doubles_the_global_batch(tmp_path, data_dir):
    out = tmp_path / "ddp"
    res = run_cli("backend.accelerator=cpu", "backend.devices=2", "backend.strategy=ddp", "epochs=1",
                  f"paths.data_dir={data_dir}", f"hydra.run.dir={out}", *QUIET, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = read_summary(out)
    assert (summary["world_size"], summary["global_batch"]) == (2, 128)
    # 2 x 180 validation images, 3 batches of 64 per process (the last 52 real): each image scored once
    check_each_val_image_counted_once(summary)
    assert summary["steps_per_epoch"] == 11 and summary["history"][0]["train/images"] == 11 * 128
    logs = "".join(p.read_text() for p in out.glob("*.log"))
    shards = set(re.findall(r"rank (\d) reads shard (\d)/2", logs))
    assert shards == {("0", "0"), ("1", "1")}, logs[-2000:]
    run_ = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(summary["mlflow_run_id"])
    assert run_.data.params["plan/world_size"] == "2"
    assert float(run_.data.params["plan/effective_lr"]) == pytest.approx(0.1 * 128 / 32)


def test_a_sweep_over_the_backends_is_one_parent_with_a_child_per_backend_and_the_same_metrics(tmp_path, data_dir):
    # the README's comparison of the two frameworks: hydrali -m backend=lightning,keras
    res = run_cli("-m", "backend=lightning,keras", "epochs=1", "pipeline=light", "model.widths=[8,16,32]",
                  "data.image_size=16", f"paths.data_dir={data_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "raised" not in res.stderr, res.stderr[-3000:]  # Hydra only warns when a callback fails
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    children = {r.data.params["backend.name"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    parents = {r.data.tags["mlflow.parentRunId"] for r in children.values()}
    assert sorted(children) == ["keras", "lightning"] and len(parents) == 1
    assert all(r.info.status == "FINISHED" for r in children.values())
    assert sorted(children["keras"].data.metrics) == sorted(children["lightning"].data.metrics)
    assert {"train/loss", "val/acc", "val/loss", "lr/last"} <= set(children["keras"].data.metrics)
    parent = client.get_run(parents.pop())
    assert parent.info.status == "FINISHED", "the parent run is closed at the end"
    assert parent.data.metrics["sweep/jobs"] == 2
    (sweep_dir,) = tmp_path.glob("multirun/*/*")  # the default sweep dir, under the launch dir
    for job in ("0", "1"):
        assert read_summary(sweep_dir / job)["epochs"] == 1


def test_two_runs_started_together_on_a_fresh_sqlite_store_are_both_recorded(tmp_path, data_dir):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}
    store = f"sqlite:///{tmp_path}/fresh.db"
    procs = [subprocess.Popen([sys.executable, "-m", "hydrali.core", "epochs=1", f"tracking.uri={store}",
                               f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / name}", *QUIET, *TINY],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("a", "b")]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    client = MlflowClient(store)
    for name in ("a", "b"):
        run_ = client.get_run(read_summary(tmp_path / name)["mlflow_run_id"])
        assert run_.info.status == "FINISHED"
        assert run_.data.params["data.batch_size"] == "64"
        assert {"train/loss", "val/acc", "val/images", "lr/first"} <= set(run_.data.metrics)
