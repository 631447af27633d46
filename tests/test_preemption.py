"""A run sent a preemption signal (SIGUSR1, as SLURM sends before preempting or at the time limit) in the middle of an
epoch saves a checkpoint there and stops; started again as the requeued job is (the same command, the same run dir)
it goes on from that step: one MLflow run with the whole history, the same training batches as an uninterrupted
run (recorded as DALI made them), and with deterministic=true on the CPU the same final weights. The same with
DDP processes (each its own batches), through submitit's launcher (which requeues), and on Keras (from the last
epoch's end)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.support.checks import read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY, with_plugin_callback
from tests.support.plugins import SIGNAL_AT_STEP

EPOCHS = 2  # the signal comes in the second, last, epoch (or between the two)


def _batches(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def _history(client: MlflowClient, run_id: str, metric: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, metric)]


ARGS = [f"epochs={EPOCHS}", "deterministic=true", *TINY, *LIGHTNING_QUIET]


def _train(folder: Path, name: str, data_dir: Path, env: dict[str, str] | None = None):
    """`hydrali <ARGS>` in folder/<name>, its batches recorded in folder/<name>.jsonl: (run dir, the process)."""
    out = folder / name
    record = with_plugin_callback("record", "RecordBatches", path=str(folder / f"{name}.jsonl"))
    done = run_cli(*ARGS, f"paths.data_dir={data_dir}", record, f"hydra.run.dir={out}", cwd=folder, env=env)
    return out, done


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
    """A run of ARGS never stopped: (its run dir, its MLflow store's client, its batches)."""
    folder = tmp_path_factory.mktemp("whole")
    whole, done = _train(folder, "whole", data_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    return whole, MlflowClient(f"sqlite:///{folder}/mlflow.db"), _batches(folder / "whole.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["mid-epoch", "last step"])
def test_a_preempted_run_resumes_where_it_stopped_as_if_never_stopped(tmp_path, data_dir, uninterrupted, where):
    whole, whole_client, whole_batches = uninterrupted
    steps = len(whole_batches) // EPOCHS
    # mid-epoch: saved in the second epoch; the last step: after the first epoch's last step, the run stops when the
    # second starts, from the checkpoint of the epoch's end (Lightning counts one saved at the last step as the
    # whole epoch, its validation not run)
    signal_at = steps + steps // 2 if where == "mid-epoch" else steps - 1
    cut, stopped = _train(tmp_path, "cut", data_dir, {SIGNAL_AT_STEP: str(signal_at)})
    assert stopped.returncode == 128 + 10, stopped.stderr[-3000:]  # 128 + SIGUSR1
    said = [line for line in stopped.stderr.splitlines() if line.startswith("hydrali: preempted")]
    last = cut / "checkpoints" / "last.ckpt"
    what = (
        f"checkpoint saved at epoch 2, step {signal_at - steps + 1} of {steps} ({last})"
        if where == "mid-epoch"
        else f"stopped before epoch 2; the checkpoint of the epoch before resumes ({last})"
    )
    assert said == [
        f"hydrali: preempted by SIGUSR1: {what}: the run is marked KILLED; the same command with "
        f"hydra.run.dir={cut} resumes it there (a requeued SLURM job does)"
    ]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = json.loads((cut / "run.json").read_text())["mlflow_run_id"]
    assert client.get_run(run_id).info.status == "KILLED"

    again, resumed = _train(tmp_path, "cut", data_dir)  # the requeued job: the same command, no signal this time
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert again == cut

    # the batches trained, as DALI made them: the stopped run's and the resumed run's, one after the other
    assert _batches(tmp_path / "cut.jsonl") == whole_batches
    # one MLflow run, the whole history, as the uninterrupted run's
    (run,) = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    whole_id = read_summary(whole)["mlflow_run_id"]
    for metric in ("train/loss", "val/loss", "val/acc", "lr/first", "lr/last", "train/images"):
        cut_history, whole_history = _history(client, run_id, metric), _history(whole_client, whole_id, metric)
        assert [step for step, _ in cut_history] == list(range(1, EPOCHS + 1)), metric
        assert [s for s, _ in cut_history] == [s for s, _ in whole_history], metric
        assert [v for _, v in cut_history] == pytest.approx([v for _, v in whole_history], abs=1e-5), metric
    assert [row["epoch"] for row in read_summary(cut)["history"]] == list(range(1, EPOCHS + 1))
    # the same final weights, to 1e-5
    cut_weights, whole_weights = _weights(cut), _weights(whole)
    assert cut_weights.keys() == whole_weights.keys()
    for name, value in whole_weights.items():
        assert torch.allclose(cut_weights[name].float(), value.float(), atol=1e-5), name


@pytest.mark.slow
def test_keras_stops_on_the_signal_and_resumes_from_its_last_whole_epoch_in_the_same_run(tmp_path, data_dir):
    out = tmp_path / "run"
    signal = "+backend.callbacks.signal={_target_: tests.support.plugins.KerasSignalAtStep}"
    args = ["backend=keras", f"epochs={EPOCHS}", *TINY, *KERAS_QUIET, f"paths.data_dir={data_dir}", signal]
    args.append(f"hydra.run.dir={out}")
    steps = 21  # the digits' training split at the default batch of 64: 1,400 images
    # a SLURM job without a launcher that requeues: hydrali runs `scontrol requeue <job id>` (SLURM's own binary is
    # not here: a script in its place records how it was called)
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol-calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    slurm = {"SLURM_JOB_ID": "4242", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    stopped = run_cli(*args, cwd=tmp_path, env={SIGNAL_AT_STEP: str(steps + 5), **slurm})
    assert stopped.returncode == 128 + 10, stopped.stderr[-3000:]
    assert calls.read_text().splitlines() == ["requeue 4242"]
    said = [line for line in stopped.stderr.splitlines() if line.startswith("hydrali: preempted")]
    assert said == [
        f"hydrali: preempted by SIGUSR1: stopped at epoch 2, step 5; Keras resumes at the start of that epoch, from "
        f"{out / 'checkpoints' / 'epoch001.weights.h5'} (DALI's TensorFlow plugin keeps no reader state to resume "
        f"mid-epoch): the run is marked KILLED; the same command with hydra.run.dir={out} resumes it there "
        f"(a requeued SLURM job does)"
    ]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = json.loads((out / "run.json").read_text())["mlflow_run_id"]
    assert client.get_run(run_id).info.status == "KILLED"

    resumed = run_cli(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    runs = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    assert [r.info.run_id for r in runs] == [run_id] and runs[0].info.status == "FINISHED"
    assert [step for step, _ in _history(client, run_id, "val/acc")] == list(range(1, EPOCHS + 1))
    summary = read_summary(out)
    assert [row["epoch"] for row in summary["history"]] == list(range(1, EPOCHS + 1)) and summary["first_epoch"] == 2


@pytest.mark.slow
def test_a_job_of_the_submitit_launcher_is_requeued_on_the_signal_and_resumes_in_its_run(tmp_path, data_dir):
    # the launcher of hydra/launcher=slurm, run on this machine: submitit's handler of the signal (here USR1, as
    # SUBMITIT_PREEMPT_SIGNAL says) requeues the job after hydrali's checkpoint, and submitit starts it again
    batches = tmp_path / "batches.jsonl"
    record = with_plugin_callback("record", "RecordBatches", path=str(batches))
    args = ["-m", "hydra/launcher=submitit_local", f"epochs={EPOCHS}", "deterministic=true", *TINY, *LIGHTNING_QUIET]
    env = {SIGNAL_AT_STEP: "30", "SUBMITIT_PREEMPT_SIGNAL": "USR1"}
    out = run_cli(*args, f"paths.data_dir={data_dir}", record, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    (job,) = tmp_path.glob("multirun/*/*/0")
    logs = "".join(p.read_text() for p in job.parent.glob(".submitit/*/*_log.*"))
    assert "Requeued job" in logs and "preempted by SIGUSR1" in logs, logs[-3000:]
    # every step of every epoch trained once, across the two starts of the job
    steps = [(b["epoch"], b["step"]) for b in _batches(batches)]
    per_epoch = len(steps) // EPOCHS
    assert steps == [(epoch, step) for epoch in range(EPOCHS) for step in range(per_epoch)]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (child,) = [
        r
        for r in client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
        if "mlflow.parentRunId" in r.data.tags
    ]
    assert child.info.status == "FINISHED"
    assert [step for step, _ in _history(client, child.info.run_id, "val/acc")] == list(range(1, EPOCHS + 1))
    assert read_summary(job)["first_epoch"] == 2


def test_a_signal_no_run_can_save_on_is_one_line_before_anything_runs(tmp_path, data_dir):
    out = run_cli("preemption.signals=[SIGKILL]", f"paths.data_dir={data_dir}", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        "hydrali: error: preemption.signals: SIGKILL is not a signal a run can save on: pass some of SIGUSR1, "
        "SIGUSR2, SIGTERM, SIGHUP, SIGXCPU, SIGCONT"
    ]
    assert not list(tmp_path.glob("outputs/*/*")) and not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_ddp_processes_agree_on_the_signal_of_one_and_all_resume_at_the_same_step(tmp_path, data_dir):
    # the signal reaches rank 0 only; the processes agree every 4 steps, so both stop after step 16 of the run (in
    # the second epoch: 11 steps an epoch of 2 x 64 images), save one checkpoint and resume there, each process
    # with its own reader's state
    ddp = ["backend.devices=2", "backend.strategy=ddp", "backend.accelerator=cpu", "preemption.check_every_n_steps=4"]
    args = [*ddp, f"epochs={EPOCHS}", *TINY, *LIGHTNING_QUIET, f"paths.data_dir={data_dir}"]

    def train(name: str, env: dict[str, str] | None = None):
        record = with_plugin_callback("record", "RecordBatches", path=str(tmp_path / f"{name}.jsonl"))
        return run_cli(*args, record, f"hydra.run.dir={tmp_path / name}", cwd=tmp_path, env=env, timeout=900)

    def batches(name: str) -> list[list[dict]]:
        return [_batches(tmp_path / f"{name}.jsonl"), _batches(tmp_path / f"{name}.jsonl.rank1")]

    whole = train("whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    stopped = train("cut", {SIGNAL_AT_STEP: "13"})
    assert stopped.returncode == 128 + 10, stopped.stderr[-3000:]
    said = [line for line in stopped.stderr.splitlines() if line.startswith("hydrali: preempted")]
    assert said == [
        f"hydrali: preempted by SIGUSR1: the job's 2 processes saved a checkpoint and stopped: the run is marked "
        f"KILLED; the same command with hydra.run.dir={tmp_path / 'cut'} resumes it there (a requeued SLURM job does)"
    ]
    first = batches("cut")
    assert [len(steps) for steps in first] == [16, 16], "both stopped after the same step"
    per_epoch = len(batches("whole")[0]) // EPOCHS
    assert first[0][-1]["epoch"] == 1 and first[0][-1]["step"] + 1 < per_epoch, "in the middle of the second epoch"

    resumed = train("cut")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert batches("cut") == batches("whole"), "each process's batches, as DALI made them, as if never stopped"
    losses = {
        name: [row["train/loss"] for row in read_summary(tmp_path / name)["history"]] for name in ("whole", "cut")
    }
    assert losses["cut"] == pytest.approx(losses["whole"], rel=1e-6), "each process resumed its own epoch's loss sums"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    (run,) = [r for r in runs if r.info.run_id == read_summary(tmp_path / "cut")["mlflow_run_id"]]
    assert run.info.status == "FINISHED"
    assert [step for step, _ in _history(client, run.info.run_id, "val/acc")] == list(range(1, EPOCHS + 1))
