"""A run dir is self-contained and never mixed: an interrupted run resumes from any working directory into its own
MLflow run with its own config files; a used dir is reused only by the same config; two processes never train in
one dir; a tracking server that does not answer is one line, before anything is written."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.support.checks import read_summary
from tests.support.cli import free_port, lightning_startup_seconds, run_cli, start_cli
from tests.support.configs import LIGHTNING_QUIET, TINY

HELD_SECONDS = 600  # the seconds held from the test's start: more than a loaded machine takes to start a run
INTERRUPT = "+backend.callbacks.interrupt={_target_: tests.support.plugins.InterruptAtEpoch, epoch: 2}"


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_an_interrupted_run_resumed_from_another_directory_finishes_in_its_own_run(tmp_path, data_dir):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    out = home / "run"
    args = ["epochs=3", "optim.lr=0.05", *TINY, *LIGHTNING_QUIET, f"paths.data_dir={data_dir}"]
    first = run_cli(*args, INTERRUPT, f"hydra.run.dir={out}", cwd=home)
    assert first.returncode == 130, first.stderr[-3000:]
    hint = [line for line in first.stderr.splitlines() if line.startswith("hydrali: interrupted")]
    assert hint == [
        f"hydrali: interrupted: the run is marked KILLED; resume it with ckpt_path=last hydra.run.dir={out}"
    ]
    config_files = _files(out / ".hydra")
    run_id = json.loads((out / "run.json").read_text())["mlflow_run_id"]

    # the hint, from another directory: the run's store, data and settings, not the defaults of this one
    resumed = run_cli("ckpt_path=last", f"hydra.run.dir={out}", cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert list(elsewhere.iterdir()) == [], "nothing is created in the working directory"
    assert _files(out / ".hydra") == config_files, "the run's config files are its first start's"
    summary = read_summary(out)
    assert [row["epoch"] for row in summary["history"]] == [1, 2, 3] and summary["first_epoch"] == 3
    client = MlflowClient(f"sqlite:///{home}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    assert [r.info.run_id for r in runs] == [run_id] == [summary["mlflow_run_id"]]
    assert runs[0].info.status == "FINISHED" and runs[0].data.params["optim.lr"] == "0.05"
    assert [m.step for m in client.get_metric_history(run_id, "val/acc")] == [1, 2, 3]


@pytest.mark.slow
def test_a_used_run_dir_resumes_the_same_config_and_refuses_another_naming_the_keys(tmp_path, data_dir):
    out = tmp_path / "run"
    args = ["epochs=1", *TINY, *LIGHTNING_QUIET, f"paths.data_dir={data_dir}", f"hydra.run.dir={out}"]
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    before = _files(out)

    other = run_cli(*args, "optim.lr=0.5", "data.batch_size=16", cwd=tmp_path)
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-3000:]
    assert other.stderr.strip().splitlines() == [
        f"hydrali: error: hydra.run.dir={out} holds a run with other settings (data.batch_size is 64 there, 16 "
        f"here; optim.lr is 0.1 there, 0.5 here): pass a new hydra.run.dir for a new run, or ckpt_path=last to "
        f"resume that run as it was"
    ]
    same = run_cli(*args, cwd=tmp_path)  # finished: it says so (tests/test_rerun.py)
    assert same.returncode == 0 and f"{out} holds this run, finished" in same.stdout, same.stderr[-3000:]
    assert _files(out) == before, "neither attempt changes anything in the run dir"

    more = run_cli(*args[1:], "epochs=2", "ckpt_path=last", cwd=tmp_path)  # resumed as it was, one epoch more
    assert more.returncode == 0, more.stderr[-3000:]
    assert [row["epoch"] for row in read_summary(out)["history"]] == [1, 2]


@pytest.mark.slow
def test_two_runs_started_at_once_in_one_dir_one_trains_the_other_is_refused_at_once(tmp_path, data_dir):
    out = tmp_path / "run"
    args = ["epochs=2", *TINY, *LIGHTNING_QUIET, f"paths.data_dir={data_dir}", f"hydra.run.dir={out}"]
    first = start_cli(*args, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not (out / "hydrali.log").exists():  # the first run passed its checks and holds the dir
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0][-3000:]
        time.sleep(0.1)
    started = time.monotonic()
    second = run_cli(*args, cwd=tmp_path)
    assert time.monotonic() - started < lightning_startup_seconds(), "refused before the framework loads"
    assert second.returncode == 2, second.stderr[-3000:]
    assert second.stderr.strip().splitlines() == [
        f"hydrali: error: hydra.run.dir={out} is in use: another hydrali process is running in it; wait for it to "
        f"end (then ckpt_path=last resumes it if it was interrupted), or pass another hydra.run.dir"
    ]
    assert first.wait(timeout=300) == 0, first.communicate()[0][-3000:]
    summary = read_summary(out)
    assert [row["epoch"] for row in summary["history"]] == [1, 2]
    assert json.loads((out / "run.json").read_text())["mlflow_run_id"] == summary["mlflow_run_id"]


@pytest.mark.slow
def test_two_runs_started_at_the_same_moment_in_one_new_dir_one_trains_to_its_end(tmp_path, data_dir):
    out = tmp_path / "new" / "run"  # made by whichever of the two gets there first
    args = ["epochs=1", *TINY, *LIGHTNING_QUIET, f"paths.data_dir={data_dir}", f"hydra.run.dir={out}"]
    runs = [start_cli(*args, cwd=tmp_path, stderr=subprocess.PIPE) for _ in range(2)]
    ended = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    assert sorted(code for code, _, _ in ended) == [0, 2], [err[-3000:] for _, _, err in ended]
    refused = next(err for code, _, err in ended if code == 2)
    assert refused.strip().splitlines() == [
        f"hydrali: error: hydra.run.dir={out} is in use: another hydrali process is running in it; wait for it to "
        f"end (then ckpt_path=last resumes it if it was interrupted), or pass another hydra.run.dir"
    ]
    summary = read_summary(out)
    assert [row["epoch"] for row in summary["history"]] == [1]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    assert [(r.info.run_id, r.info.status) for r in runs] == [(summary["mlflow_run_id"], "FINISHED")]


@pytest.mark.slow
def test_a_run_with_the_default_dir_whose_second_another_run_holds_gets_a_dir_of_its_own(tmp_path, data_dir):
    """The default dir is named by the second the run started (outputs/<date>/<time>). Every second of the next
    minutes is held here as a run holds its dir (flock on it), so that the run started meets "another run started in
    the same second" for certain: it trains in <time>_2, its own dir and MLflow run (before: refused, "is in use")."""
    held, start = [], datetime.now()
    try:
        for second in range(HELD_SECONDS):
            moment = start + timedelta(seconds=second)
            folder = tmp_path / "outputs" / moment.strftime("%Y-%m-%d") / moment.strftime("%H-%M-%S")
            folder.mkdir(parents=True)
            held.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY))
            fcntl.flock(held[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
        out = run_cli("epochs=1", *TINY, *LIGHTNING_QUIET, f"paths.data_dir={data_dir}", cwd=tmp_path)
    finally:
        for descriptor in held:
            os.close(descriptor)
    assert out.returncode == 0, out.stderr[-3000:]
    (own,) = [path for path in (tmp_path / "outputs").glob("*/*") if any(path.iterdir())]
    assert own.name.endswith("_2") and (own.parent / own.name.removesuffix("_2")).is_dir(), own
    summary = read_summary(own)
    assert [row["epoch"] for row in summary["history"]] == [1]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    assert [(r.info.run_id, r.info.status) for r in runs] == [(summary["mlflow_run_id"], "FINISHED")]


@pytest.mark.slow
def test_a_tracking_server_that_never_answers_is_one_line_before_anything_is_written(tmp_path, data_dir):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        out = tmp_path / "run"
        started = time.monotonic()
        result = run_cli(
            *TINY,
            f"paths.data_dir={data_dir}",
            f"tracking.uri={uri}",
            "tracking.timeout_s=3",
            f"hydra.run.dir={out}",
            cwd=tmp_path,
        )
    assert time.monotonic() - started < 30
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"hydrali: error: the MLflow server at tracking.uri={uri} accepted the connection but did not answer "
        f"within 3 s (tracking.timeout_s): check the server, or use tracking.uri=sqlite:///<path> or tracking=none"
    ]
    assert not out.exists(), "no run dir is left behind"


@pytest.mark.slow
def test_hydrali_ui_on_a_taken_port_is_one_line_and_prints_the_runs_list(tmp_path, data_dir):
    assert run_cli("epochs=1", *TINY, *LIGHTNING_QUIET, f"paths.data_dir={data_dir}", cwd=tmp_path).returncode == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        refused = run_cli("ui", f"tracking.ui_port={port}", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hydrali: error: tracking.ui_port={port} is taken on 127.0.0.1")
    assert "pass tracking.ui_port=" in lines[0]

    port = free_port()
    ui = start_cli("ui", f"tracking.ui_port={port}", cwd=tmp_path)
    try:
        first_line = ui.stdout.readline()
        client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        experiment = client.get_experiment_by_name("hydrali").experiment_id
        assert f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs" in first_line, first_line
    finally:
        ui.terminate()  # hydrali stops the server's whole process group (a SIGKILL would leave it running)
        ui.wait(timeout=60)


def test_a_tracking_server_that_stops_answering_ends_the_tracking_not_the_training(tmp_path, caplog, monkeypatch):
    from hydrali.core.tracking.mlflow_runs import (
        HTTP_BACKOFF,
        HTTP_RETRIES,
        HTTP_TIMEOUT,
        MlflowTracker,
        configure_http,
    )

    for name in (HTTP_TIMEOUT, HTTP_RETRIES, HTTP_BACKOFF):  # set here: restored as they were after the test
        monkeypatch.setenv(name, "")
    configure_http(timeout_s=1, retries=0)
    gone = f"http://127.0.0.1:{free_port()}"  # the server went away: nothing listens there any more
    tracker = MlflowTracker(MlflowClient(gone), "0" * 32, gone, tmp_path)
    started = time.monotonic()
    tracker.log_metrics({"train/loss": 1.0}, step=1)
    tracker.log_metrics({"train/loss": 0.5}, step=2)
    tracker.finish("FINISHED")
    assert time.monotonic() - started < 10 and tracker.stopped
    stopped = [r.getMessage() for r in caplog.records if "tracking stopped" in r.getMessage()]
    assert len(stopped) == 1 and f"{tmp_path}/history.json" in stopped[0], stopped


def test_a_key_added_since_a_run_was_recorded_takes_the_value_its_own_task_declared(monkeypatch):
    """Two tasks may declare one added key with values of their own: a record of each task without the key is
    compared as if it held its task's value (registry.added_keys), not another task's."""
    from dataclasses import replace

    from hydrali.core.contracts import registry
    from hydrali.core.run.run_dir import differences

    real = registry.task_specs()
    specs = {
        "classification": replace(real["classification"], added_keys={"model.extra": "conv"}),
        "detection": replace(real["detection"], added_keys={"model.extra": "avgpool"}),
    }
    monkeypatch.setattr(registry, "task_specs", lambda: specs)
    for task, value, other in (("classification", "conv", "avgpool"), ("detection", "avgpool", "conv")):
        then = {"task": {"name": task}, "model": {"layers": [1]}}
        assert differences(then, {"task": {"name": task}, "model": {"layers": [1], "extra": value}}) == ""
        changed = differences(then, {"task": {"name": task}, "model": {"layers": [1], "extra": other}})
        assert changed == f"model.extra is '{value}' there, '{other}' here"


def test_a_keras_run_recorded_before_backend_processes_compares_as_one_process():
    """backend.processes (Keras) was added after runs were recorded without it: such a record is compared as if it
    held `one` (the BackendSpec's added_keys), so its run dir takes the same command again; per_device differs."""
    from hydrali.core.run.run_dir import differences

    then = {"task": {"name": "classification"}, "backend": {"name": "keras", "devices": "auto"}}
    now = {"task": {"name": "classification"}, "backend": {"name": "keras", "devices": "auto", "processes": "one"}}
    assert differences(then, now) == ""
    now["backend"]["processes"] = "per_device"
    assert differences(then, now) == "backend.processes is 'one' there, 'per_device' here"
