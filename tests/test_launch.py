"""A job's DDP processes started by hydrali from the job's resolved config: sweeps of DDP jobs (one run dir and
one MLflow run per job, each trained by its processes), and ranks that agree on the seed drawn once."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.support.checks import read_summary
from tests.support.cli import free_port, run_cli, start_cli
from tests.support.configs import LIGHTNING_QUIET, TINY, compose_config, with_plugin_callback
from tests.support.datasets import write_one_image_per_class

pytestmark = pytest.mark.slow
QUIET_TINY = [*TINY, *LIGHTNING_QUIET]  # a narrow network on 16 x 16 images, no progress output
DDP = ["backend.devices=2", "backend.strategy=ddp", "backend.accelerator=cpu"]


def test_a_sweep_of_ddp_jobs_trains_each_job_with_two_processes_that_share_one_drawn_seed(tmp_path, data_dir):
    seeds = tmp_path / "seeds"
    out = run_cli(
        "-m",
        "optim.lr=0.01,0.1",
        *DDP,
        "epochs=1",
        "seed=null",
        *QUIET_TINY,
        f"paths.data_dir={data_dir}",
        with_plugin_callback("seed", "RecordTorchSeed", folder=f"{seeds}/${{hydra:job.num}}"),
        cwd=tmp_path,
        timeout=900,
    )
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
    # hydra/launcher=slurm sizes each SLURM job from the backend: nodes x tasks (one per device)
    cfg = compose_config(["hydra/launcher=slurm", "backend.devices=4", "backend.num_nodes=2"], tmp_path, data_dir)
    from hydra.core.hydra_config import HydraConfig

    launcher = HydraConfig.get().launcher
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 4, 4)
    assert launcher._target_.endswith("SlurmLauncher") and cfg.backend.devices == 4
    # the same group's local launcher runs a job for real, in a process submitit starts
    out = run_cli(
        "-m",
        "hydra/launcher=submitit_local",
        "optim.lr=0.05",
        "epochs=1",
        *QUIET_TINY,
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (job,) = [p for p in tmp_path.glob("multirun/*/*/0")]
    assert list(job.parent.glob(".submitit/*")), "submitit ran the job"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (child,) = [
        r
        for r in client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
        if "mlflow.parentRunId" in r.data.tags
    ]
    assert child.info.status == "FINISHED" and read_summary(job)["epochs"] == 1


def _torchrun_node(node_rank: int, port: int, args: list[str], cwd):
    """One node of a two-node job on 127.0.0.1: torchrun starting one hydrali process."""
    torchrun = (
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        f"--node-rank={node_rank}",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        "-m",
        "hydrali.core",
    )
    return start_cli(*args, cwd=cwd, entry=torchrun)


def test_two_nodes_started_by_torchrun_read_disjoint_shards_into_one_run_dir_and_one_mlflow_run(tmp_path):
    classes, batch = 32, 8  # 2 nodes x 2 steps x batch 8: every image once per epoch
    write_one_image_per_class(tmp_path / "ds", classes)
    record = tmp_path / "record"
    args = [
        "data=imagefolder",
        f"data.root={tmp_path / 'ds'}",
        f"data.batch_size={batch}",
        "epochs=1",
        "seed=null",
        "backend.num_nodes=2",
        "backend.accelerator=cpu",
        *QUIET_TINY,
        with_plugin_callback("labels", "RecordTrainingLabels", folder=str(record)),
        with_plugin_callback("seed", "RecordTorchSeed", folder=str(record)),
    ]
    port = free_port()
    node0 = _torchrun_node(0, port, args, tmp_path)
    other_machine = tmp_path / "node1"  # node 1 runs from its own folder: its own outputs/ and run dir
    other_machine.mkdir()
    node1 = _torchrun_node(1, port, args, other_machine)
    outputs = [node.communicate(timeout=600)[0] for node in (node0, node1)]
    assert node0.returncode == 0 and node1.returncode == 0, "\n".join(out[-3000:] for out in outputs)

    read = [
        [int(x) for line in (record / f"labels_rank{r}.txt").read_text().split("\n") for x in line.split()]
        for r in (0, 1)
    ]
    assert len(read[0]) == len(read[1]) == classes // 2, "each rank trained on its half of the epoch"
    assert set(read[0]).isdisjoint(read[1]), "the two nodes read disjoint shards"
    assert sorted(read[0] + read[1]) == list(range(classes)), "together they cover the dataset"

    run_dirs = [p for p in tmp_path.glob("**/outputs/*/*") if p.is_dir()]
    assert len(run_dirs) == 1, f"one run dir for the job, not one per node: {run_dirs}"
    assert run_dirs[0].is_relative_to(tmp_path / "outputs"), "node 0's, where the job was started"
    summary = read_summary(run_dirs[0])
    assert summary["world_size"] == 2 and summary["epochs"] == 1
    assert (run_dirs[0] / "hydrali_rank1.log").is_file(), "node 1 logs into the job's run dir"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    seeds = {(record / f"seed_rank{r}.txt").read_text().split()[0] for r in (0, 1)}
    assert seeds == {run.data.params["plan/seed"]}, "both nodes train with the one seed that is logged"


def test_one_step_of_two_ddp_processes_or_of_two_accumulated_batches_at_batch_b_equals_one_at_batch_2b(tmp_path):
    import torch

    batch = 8  # 16 images: one step of 2 x 8, of 2 batches of 8 or of 1 x 16 on the same samples (no random
    #   augmentation; the first epoch reads each image once)
    write_one_image_per_class(tmp_path / "ds", 2 * batch)
    common = [
        "data=imagefolder",
        f"data.root={tmp_path / 'ds'}",
        "epochs=1",
        "seed=7",
        "optim=sgd",
        "optim.warmup_epochs=0",
        "optim.schedule=constant",
        "optim.lr=0.5",
        "model._target_=tests.support.plugins.torch_model_without_batchnorm",
        "tracking=none",
        *QUIET_TINY,
    ]
    runs = {
        "ddp": (*DDP, f"data.batch_size={batch}"),
        "one": ("backend.accelerator=cpu", f"data.batch_size={2 * batch}"),
        "accumulated": ("backend.accelerator=cpu", f"data.batch_size={batch}", "optim.accumulate_grad_batches=2"),
    }
    for name, args in runs.items():
        out = run_cli(*common, *args, f"hydra.run.dir={tmp_path / name}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
    ddp, one, accumulated = (
        torch.load(tmp_path / name / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        for name in runs
    )
    summaries = {name: read_summary(tmp_path / name) for name in runs}
    assert [summaries[name]["world_size"] for name in runs] == [2, 1, 1]
    assert [summaries[name]["global_batch"] for name in runs] == [2 * batch] * 3, "the lr counts the same images"
    assert summaries["accumulated"]["steps_per_epoch"] == 2, "two batches trained"
    for other in (ddp, accumulated):
        assert other["global_step"] == one["global_step"] == 1, "one optimizer step each"
        for key, weight in one["state_dict"].items():
            torch.testing.assert_close(other["state_dict"][key], weight, atol=1e-5, rtol=0, msg=key)
    # the step moved the weights: SGD's momentum buffer after one step is the (averaged) gradient
    grads = {
        name: [s["momentum_buffer"] for s in c["optimizer_states"][0]["state"].values()]
        for name, c in zip(runs, (ddp, one, accumulated))
    }
    assert all(g.abs().max() > 1e-4 for g in grads["one"]), "every parameter got a gradient"
    for other in ("ddp", "accumulated"):
        for other_grad, one_grad in zip(grads[other], grads["one"], strict=True):
            torch.testing.assert_close(other_grad, one_grad, atol=1e-5, rtol=0)


def test_processes_started_by_mpirun_train_one_job_at_their_ranks(tmp_path):
    write_one_image_per_class(tmp_path / "ds", 16)
    record = tmp_path / "record"
    args = [
        "data=imagefolder",
        f"data.root={tmp_path / 'ds'}",
        "data.batch_size=4",
        "epochs=1",
        "seed=null",
        *DDP,
        *QUIET_TINY,
        with_plugin_callback("labels", "RecordTrainingLabels", folder=str(record)),
    ]
    meet = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [
        start_cli(
            *args,
            cwd=tmp_path,
            env={
                **meet,
                "OMPI_COMM_WORLD_RANK": str(rank),
                "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
        )
        for rank in (0, 1)
    ]  # as `mpirun -np 2 -x MASTER_ADDR -x MASTER_PORT hydrali ...` starts them
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(out[-3000:] for out in outputs)
    read = [{int(x) for x in (record / f"labels_rank{r}.txt").read_text().split()} for r in (0, 1)]
    assert read[0].isdisjoint(read[1]) and read[0] | read[1] == set(range(16)), "rank 0 and rank 1, two shards"
    (run_dir,) = [p for p in tmp_path.glob("outputs/*/*") if p.is_dir()]
    assert read_summary(run_dir)["world_size"] == 2


def test_tasks_started_by_srun_share_rank_0s_run_dir_and_seed(tmp_path):
    write_one_image_per_class(tmp_path / "ds", 16)
    record = tmp_path / "record"
    args = [
        "data=imagefolder",
        f"data.root={tmp_path / 'ds'}",
        "data.batch_size=4",
        "epochs=1",
        "seed=null",
        *DDP,
        *QUIET_TINY,
        with_plugin_callback("seed", "RecordTorchSeed", folder=str(record)),
    ]
    slurm = {
        "SLURM_JOB_ID": "4321",
        "SLURM_JOB_NAME": "train",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
    }
    folders = [tmp_path, tmp_path / "task1"]  # task 1 composes its config in another folder: its own run dir
    folders[1].mkdir()
    # as `srun --ntasks-per-node=2 hydrali ...` starts them (Lightning's SLURM environment)
    procs = [
        start_cli(*args, cwd=folders[rank], env={**slurm, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)})
        for rank in (0, 1)
    ]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(out[-3000:] for out in outputs)
    run_dirs = [p for p in tmp_path.glob("**/outputs/*/*") if p.is_dir()]
    assert len(run_dirs) == 1 and run_dirs[0].is_relative_to(tmp_path / "outputs"), run_dirs
    assert read_summary(run_dirs[0])["world_size"] == 2 and (run_dirs[0] / "hydrali_rank1.log").is_file()
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    seeds = {(record / f"seed_rank{r}.txt").read_text().split()[0] for r in (0, 1)}
    assert seeds == {run.data.params["plan/seed"]}, "both tasks train with the one seed that is logged"
