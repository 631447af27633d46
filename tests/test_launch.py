"""A job's DDP processes started by hydrali from the job's resolved config: sweeps of DDP jobs (one run dir and
one MLflow run per job, each trained by its processes), and ranks that agree on the seed drawn once."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import read_summary, run_cli

pytestmark = pytest.mark.slow
TINY = ["pipeline=light", "model.widths=[8,16,32]", "data.image_size=16", "backend.trainer.enable_progress_bar=false",
        "backend.trainer.enable_model_summary=false"]
DDP = ["backend.devices=2", "backend.strategy=ddp", "backend.accelerator=cpu"]


def test_a_sweep_of_ddp_jobs_trains_each_job_with_two_processes_that_share_one_drawn_seed(tmp_path, data_dir):
    seeds = tmp_path / "seeds"
    out = run_cli("-m", "optim.lr=0.01,0.1", *DDP, "epochs=1", "seed=null", *TINY, f"paths.data_dir={data_dir}",
                  "+backend.callbacks.seed={_target_: tests.helpers.RecordTorchSeed, folder: "
                  + str(seeds) + "/${hydra:job.num}}", cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(p for p in tmp_path.glob("multirun/*/*/*") if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"], "one run dir per job, whatever the number of processes"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)
    assert sorted(r.data.params["optim.lr"] for r in children) == ["0.01", "0.1"]
    for job in jobs:
        summary = read_summary(job)
        assert summary["world_size"] == 2 and summary["global_batch"] == 128
        recorded = {f.name: f.read_text().split() for f in (seeds / job.name).glob("seed_rank*.txt")}
        assert sorted(recorded) == ["seed_rank0.txt", "seed_rank1.txt"], "two processes trained the job"
        (seed0, pid0, world0), (seed1, pid1, world1) = recorded["seed_rank0.txt"], recorded["seed_rank1.txt"]
        assert pid0 != pid1 and world0 == world1 == "2"
        logged = client.get_run(summary["mlflow_run_id"]).data.params["plan/seed"]
        assert seed0 == seed1 == logged, "both ranks train with the one seed that is logged"


def test_a_job_runs_through_the_submitit_launcher_of_the_slurm_config_group(tmp_path, data_dir):
    from tests.conftest import compose_config

    # hydra/launcher=slurm sizes each SLURM job from the backend: nodes x tasks (one per device)
    cfg = compose_config(["hydra/launcher=slurm", "backend.devices=4", "backend.num_nodes=2"], tmp_path, data_dir)
    from hydra.core.hydra_config import HydraConfig
    launcher = HydraConfig.get().launcher
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 4, 4)
    assert launcher._target_.endswith("SlurmLauncher") and cfg.backend.devices == 4
    # the same group's local launcher runs a job for real, in a process submitit starts
    out = run_cli("-m", "hydra/launcher=submitit_local", "optim.lr=0.05", "epochs=1", *TINY,
                  f"paths.data_dir={data_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (job,) = [p for p in tmp_path.glob("multirun/*/*/0")]
    assert list(job.parent.glob(".submitit/*")), "submitit ran the job"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (child,) = [r for r in client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
                if "mlflow.parentRunId" in r.data.tags]
    assert child.info.status == "FINISHED" and read_summary(job)["epochs"] == 1
