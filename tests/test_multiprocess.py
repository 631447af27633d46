"""Several processes through the real launchers: Lightning DDP (CPU, gloo) and a Hydra -m sweep."""

import json

import pytest
from mlflow.tracking import MlflowClient

from tests.support.checks import check_each_val_image_counted_once, read_summary
from tests.support.cli import run_cli, start_cli
from tests.support.configs import LIGHTNING_QUIET, TINY, compose_config, with_plugin_callback
from tests.support.datasets import write_one_image_per_class

pytestmark = pytest.mark.slow


def test_ddp_with_two_processes_reads_two_disjoint_shards_and_doubles_the_global_batch(tmp_path, data_dir):
    # every image its own class: the labels each process trained on name the files DALI read for it
    classes, batch = 36, 8  # shards of 18: 2 whole training batches, 3 validation batches (the last holds 2)
    write_one_image_per_class(tmp_path / "ds", classes)
    out, record = tmp_path / "ddp", tmp_path / "record"
    args = [
        "data=imagefolder",
        f"data.root={tmp_path / 'ds'}",
        f"data.batch_size={batch}",
        "backend.accelerator=cpu",
        "backend.devices=2",
        "backend.strategy=ddp",
        "epochs=1",
        *TINY,
        *LIGHTNING_QUIET,
        "pipeline.options.initial_fill=1",  # DALI's shuffle buffer draws nothing from the next pass
        with_plugin_callback("labels", "RecordTrainingLabels", folder=str(record)),
        "backend.ddp_bucket_mb=50",
        with_plugin_callback("ddp", "RecordDdp", folder=str(record)),
    ]
    res = run_cli(*args, f"hydra.run.dir={out}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    # DDP's set-up lines in the log files only, not on the console (the plan line says the replicas there)
    assert "distributed_backend=" not in res.stdout + res.stderr and "Initializing distributed" not in res.stdout
    logs = "".join(path.read_text() for path in out.glob("*.log"))
    assert "All distributed processes registered. Starting with 2 processes" in logs
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in logs
    summary = read_summary(out)
    assert (summary["world_size"], summary["global_batch"]) == (2, 2 * batch)
    check_each_val_image_counted_once(summary, val_set=classes)
    assert summary["steps_per_epoch"] == 2 and summary["history"][0]["train/images"] == 2 * 2 * batch
    read = [[int(x) for x in (record / f"labels_rank{r}.txt").read_text().split()] for r in (0, 1)]
    assert len(read[0]) == len(set(read[0])) == 2 * batch, "rank 0 trained on 2 batches of distinct images"
    assert len(read[1]) == len(set(read[1])) == 2 * batch, "rank 1 too"
    assert set(read[0]).isdisjoint(read[1]), "the two processes read disjoint shards"
    for rank in (0, 1):  # torch's DDP wrapped the network with the gradient buckets backend.ddp_bucket_mb asked for
        ddp = json.loads((record / f"ddp_rank{rank}.json").read_text())
        assert ddp == {"wrapper": "DistributedDataParallel", "bucket_bytes": 50 * 1024 * 1024}
    cfg = compose_config(args, tmp_path, data_dir)
    run_ = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(summary["mlflow_run_id"])
    assert run_.data.params["plan/world_size"] == "2"
    assert float(run_.data.params["plan/effective_lr"]) == pytest.approx(cfg.optim.lr * 2 * batch / cfg.optim.ref_batch)


def test_a_sweep_over_the_backends_is_one_parent_with_a_child_per_backend_and_the_same_metrics(tmp_path, data_dir):
    # the README's comparison of the two frameworks: hydrali -m backend=lightning,keras
    res = run_cli("-m", "backend=lightning,keras", "epochs=1", *TINY, f"paths.data_dir={data_dir}", cwd=tmp_path)
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
    store = f"sqlite:///{tmp_path}/fresh.db"
    procs = [
        start_cli(
            "epochs=1",
            f"tracking.uri={store}",
            f"paths.data_dir={data_dir}",
            f"hydra.run.dir={tmp_path / name}",
            *LIGHTNING_QUIET,
            *TINY,
            cwd=tmp_path,
        )
        for name in ("a", "b")
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
    client = MlflowClient(store)
    for name in ("a", "b"):
        run_ = client.get_run(read_summary(tmp_path / name)["mlflow_run_id"])
        assert run_.info.status == "FINISHED"
        assert run_.data.params["data.batch_size"] == "64"
        assert {"train/loss", "val/acc", "val/images", "lr/first"} <= set(run_.data.metrics)
