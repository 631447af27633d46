"""The same command started again: on a finished run it says so, exits 0 and changes nothing (no file, nothing in
MLflow); a sweep killed (SIGKILL, Ctrl+C) and started again in its dir keeps its finished jobs FINISHED and untrained,
resumes the others and ends with its parent run FINISHED and exit 0; an Optuna search without a storage proposes its
trials again in the same order, so it goes on the same way (one with a storage is refused: the sweeper's optuna cannot
open one here)."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.support.checks import fails_with, read_summary
from tests.support.cli import as_from_a_terminal, run_cli, start_cli
from tests.support.configs import LIGHTNING_QUIET, TINY

QUIET_TINY = [*TINY, *LIGHTNING_QUIET]  # a narrow network on 16 x 16 images, no progress output: seconds per job
EPOCHS = "epochs=2"  # two epochs a job: a job stopped after its first epoch has one left to resume
# a job stopped when its first epoch is recorded: two epochs left, so that it is still training when the signal lands
EPOCHS_TO_SPARE = "epochs=3"
GRID = ["-m", "optim.lr=0.05,0.1"]  # two jobs: the first finishes, the second is stopped
STOP_WITHIN_S = 300  # how long the test waits for the moment it stops a sweep at
POLL_S = 0.05


def _snapshot(root: Path, folder: Path) -> tuple:
    """Every file under `folder` (path, mtime, md5) and every MLflow run of the store in `root` (id, status, end
    time, params, tags, each metric's whole history): what a finished run started again must leave as it was."""
    files = sorted(
        (str(p.relative_to(folder)), p.stat().st_mtime_ns, hashlib.md5(p.read_bytes()).hexdigest())
        for p in folder.rglob("*")
        if p.is_file()
    )
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    store = sorted(
        (
            r.info.run_id,
            r.info.status,
            r.info.end_time,
            sorted(r.data.params.items()),
            sorted(r.data.tags.items()),
            sorted(
                (key, sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(r.info.run_id, key)))
                for key in r.data.metrics
            ),
        )
        for r in runs
    )
    return files, store


def _runs(root: Path):
    """(parent runs, child runs) of the store in `root`."""
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parents, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def _finished_line(folder: Path) -> str:
    """The first line a finished run started again prints."""
    return f"hydrali: {folder} holds this run, finished: nothing to train (its summary: {folder / 'summary.json'};"


def _stopped_at(proc: subprocess.Popen, ready: Path, log: Path, how: int) -> None:
    """Send `how` to the sweep `proc` as soon as `ready` exists, and wait for it to end."""
    deadline = time.monotonic() + STOP_WITHIN_S
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(POLL_S)
    proc.send_signal(how)
    proc.wait(timeout=STOP_WITHIN_S)


@pytest.mark.slow
def test_a_finished_run_started_again_says_so_exits_0_and_changes_nothing(tmp_path, data_dir):
    out = tmp_path / "run"
    args = [EPOCHS, *QUIET_TINY, f"paths.data_dir={data_dir}", f"hydra.run.dir={out}"]
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = read_summary(out)
    before = _snapshot(tmp_path, tmp_path)

    for again in ([], ["ckpt_path=last"]):  # the command as it was; and asking to resume it, the settings the same
        same = run_cli(*args, *again, cwd=tmp_path)
        assert same.returncode == 0 and "Traceback" not in same.stderr, same.stderr[-3000:]
        best = summary["best"]["val/acc"]
        assert same.stdout.strip().splitlines() == [
            f"{_finished_line(out)} ckpt_path=last epochs=<more than 2> trains on)",
            f"hydrali: best val/acc {best:.4f} at epoch {summary['best_epoch']} of 2; "
            f"MLflow run {summary['mlflow_run_id']}",
        ], again
        assert _snapshot(tmp_path, tmp_path) == before, f"{again}: nothing written, no MLflow run opened or changed"

    other = run_cli(*args, "optim.lr=0.5", cwd=tmp_path)  # another config in that dir: refused as ever
    assert other.returncode == 2 and "holds a run with other settings" in other.stderr, other.stderr[-3000:]


@pytest.mark.slow
def test_a_sweep_killed_between_its_jobs_and_started_again_trains_each_job_once(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    args = [*GRID, EPOCHS, *QUIET_TINY, f"paths.data_dir={data_dir}", f"hydra.sweep.dir={sweep}"]
    log = tmp_path / "first.log"
    with log.open("w") as output:
        first = start_cli(*args, cwd=tmp_path, stdout=output)
        _stopped_at(first, sweep / "0" / "summary.json", log, signal.SIGKILL)  # as a scheduler or the OOM killer
    assert first.returncode == -signal.SIGKILL
    finished_before = _snapshot(tmp_path, sweep / "0")
    (finished_job,) = [c for c in _runs(tmp_path)[1] if c.data.tags["hydrali.job"] == "0"]
    assert finished_job.info.status == "FINISHED" and "hydrali.objective" in finished_job.data.tags  # recorded whole

    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _finished_line(sweep / "0") in again.stdout
    assert "hydrali sweep summary: 2 job(s), 0 failed; parent run FINISHED" in again.stdout
    # job 0 untouched: its files, and its MLflow run as the killed sweep left it (FINISHED, its epochs once)
    files_now, store_now = _snapshot(tmp_path, sweep / "0")
    assert files_now == finished_before[0]
    assert [run for run in store_now if run[0] == finished_job.info.run_id] == [
        run for run in finished_before[1] if run[0] == finished_job.info.run_id
    ]
    parents, children = _runs(tmp_path)
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert sorted((c.data.tags["hydrali.job"], c.info.status) for c in children) == [
        ("0", "FINISHED"),
        ("1", "FINISHED"),
    ]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    for child in children:
        assert [m.step for m in client.get_metric_history(child.info.run_id, "val/acc")] == [1, 2]
    assert [row["epoch"] for row in read_summary(sweep / "1")["history"]] == [1, 2]


@pytest.mark.slow
def test_a_sweep_stopped_by_ctrl_c_and_started_again_ends_with_its_parent_finished(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    args = [*GRID, EPOCHS_TO_SPARE, *QUIET_TINY, f"paths.data_dir={data_dir}", f"hydra.sweep.dir={sweep}"]
    log = tmp_path / "first.log"
    with log.open("w") as output:
        first = start_cli(*args, cwd=tmp_path, stdout=output, preexec_fn=as_from_a_terminal)
        _stopped_at(first, sweep / "1" / "history.json", log, signal.SIGINT)  # the second job trained an epoch
    assert first.returncode == 130, log.read_text()[-3000:]
    parents, children = _runs(tmp_path)
    assert [p.info.status for p in parents] == ["KILLED"]
    stopped = {c.data.tags["hydrali.job"]: c.info.run_id for c in children}

    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "hydrali sweep summary: 2 job(s), 0 failed; parent run FINISHED" in again.stdout
    assert "Callback" not in again.stderr, again.stderr[-3000:]  # Hydra's warning when closing the sweep failed
    parents_now, children_now = _runs(tmp_path)
    assert [(p.info.run_id, p.info.status) for p in parents_now] == [(parents[0].info.run_id, "FINISHED")]
    assert {c.data.tags["hydrali.job"]: (c.info.run_id, c.info.status) for c in children_now} == {
        job: (run_id, "FINISHED") for job, run_id in stopped.items()
    }, "the stopped job went on in its own MLflow run"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    table = json.loads(Path(client.download_artifacts(parents[0].info.run_id, "sweep/summary.json")).read_text())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]  # replaced when the parent closed again
    assert sorted((str(row["job"]), row["status"]) for row in rows) == [("0", "FINISHED"), ("1", "FINISHED")]


@pytest.mark.slow
def test_an_optuna_search_without_a_storage_started_again_goes_on_with_the_same_trials(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    args = [
        "hparams_search=classification_optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.seed=0",  # the seed that makes the study proposed again the same
        EPOCHS,
        *QUIET_TINY,
        f"paths.data_dir={data_dir}",
        f"hydra.sweep.dir={sweep}",
    ]
    log = tmp_path / "first.log"
    with log.open("w") as output:
        first = start_cli(*args, cwd=tmp_path, stdout=output)
        _stopped_at(first, sweep / "0" / "summary.json", log, signal.SIGKILL)
    (trial,) = [c for c in _runs(tmp_path)[1] if c.data.tags["hydrali.job"] == "0"]

    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _finished_line(sweep / "0") in again.stdout, "trial 0 proposed again with its settings: not trained"
    parents, children = _runs(tmp_path)
    assert [p.info.status for p in parents] == ["FINISHED"]
    by_job = {c.data.tags["hydrali.job"]: c for c in children}
    assert sorted(by_job) == ["0", "1"] and all(c.info.status == "FINISHED" for c in children)
    assert by_job["0"].info.run_id == trial.info.run_id and by_job["0"].data.params == trial.data.params


def test_an_optuna_search_with_a_storage_is_refused_in_one_line_before_anything_is_written(tmp_path, data_dir):
    """optuna 2.10 (the Optuna sweeper's) cannot open a storage beside SQLAlchemy 2: before, a traceback after
    mlflow.db, the sweep's dir and the storage's file were written."""
    storage = tmp_path / "study.db"
    args = [
        "hparams_search=classification_optuna",
        f"hydra.sweeper.storage=sqlite:///{storage}",
        "hydra.sweeper.n_trials=1",
        *QUIET_TINY,
        f"paths.data_dir={data_dir}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    before = sorted(tmp_path.iterdir())
    refused = run_cli(*args, cwd=tmp_path)
    fails_with(refused, f"hydra.sweeper.storage=sqlite:///{storage}", "leave it null")
    assert sorted(tmp_path.iterdir()) == before


def test_a_job_of_a_sweep_started_again_reopens_the_sweeps_closed_parent(tmp_path):
    from hydrali.core.tracking import mlflow_runs

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("hydrali")
    sweep_dir = str(tmp_path / "sweep")
    parent = mlflow_runs.sweep_parent(client, experiment, sweep_dir)
    client.set_terminated(parent, "KILLED")  # the sweep was stopped by Ctrl+C
    assert mlflow_runs.sweep_parent(client, experiment, sweep_dir) == parent, "one parent for the sweep's dir"
    assert client.get_run(parent).info.status == "RUNNING"
    assert mlflow_runs.find_sweep_parent(client, experiment, sweep_dir) == parent, "closed at the sweep's end"
