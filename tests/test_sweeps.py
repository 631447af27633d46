"""Sweeps as a user runs them (`hydrali -m ...`, subprocesses), observed through MLflow's client, the REST API
of the server `hydrali ui` starts, Optuna's own results file and the pictures' pixels: one parent per sweep
with a child per job, failed jobs recorded and the sweep going on, the parent always closed with a summary."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient
from PIL import Image

from tests.support.cli import REPO, as_from_a_terminal, free_port, run_cli, start_cli
from tests.support.configs import LIGHTNING_QUIET, TINY
from tests.support.processes import descendants

pytestmark = pytest.mark.slow
UI_START_WITHIN_S = 300  # MLflow's server starting on a loaded 2-core machine
UI_GONE_WITHIN_S = 30  # the server's processes get 10 s to stop on SIGTERM (core/cli/ui_guard.py), then SIGKILL
QUIET_TINY = [*TINY, *LIGHTNING_QUIET]  # a narrow network on 16 x 16 images, no progress output: seconds per job
# matplotlib's first line colours (its default cycle): the pictures draw job i in colour i
CYCLE = [(0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C), (0xD6, 0x27, 0x28), (0x94, 0x67, 0xBD)]


def _sweep(tmp_path: Path, data_dir: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return run_cli(*args, f"paths.data_dir={data_dir}", cwd=tmp_path, **kwargs)


def _runs(tmp_path: Path):
    """(client, parent runs, child runs) of the store in `tmp_path`."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id], max_results=1000)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return client, parents, children


def _artifact(client: MlflowClient, run_id: str, path: str) -> Path:
    return Path(client.download_artifacts(run_id, path))


def _colours_drawn(png: Path) -> int:
    """How many of matplotlib's first line colours the picture holds (pixels of exactly that colour)."""
    pixels = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3).astype(int)
    found = [bool((np.abs(pixels - colour).max(axis=1) <= 2).sum() >= 20) for colour in CYCLE]
    return found.index(False) if False in found else len(found)


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _rest(port: int, endpoint: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/2.0/mlflow/{endpoint}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def grid(tmp_path_factory, data_dir):
    """A 2 x 2 grid sweep of 2 epochs per job."""
    root = tmp_path_factory.mktemp("grid")
    out = _sweep(root, data_dir, "-m", "optim.lr=0.05,0.1", "data.batch_size=32,64", "epochs=2", *QUIET_TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    return root, out


def test_a_grid_sweep_is_one_parent_with_a_child_per_job(grid):
    root, out = grid
    client, parents, children = _runs(root)
    assert len(parents) == 1 and len(children) == 4
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted((c.data.params["optim.lr"], c.data.params["data.batch_size"]) for c in children) == [
        ("0.05", "32"),
        ("0.05", "64"),
        ("0.1", "32"),
        ("0.1", "64"),
    ]
    assert all(c.info.status == "FINISHED" for c in children)
    parent = client.get_run(parents[0].info.run_id)
    assert parent.info.status == "FINISHED"
    assert (parent.data.metrics["sweep/jobs"], parent.data.metrics["sweep/failed"]) == (4, 0)
    # each job's best val/acc, read from its own metric history
    best_of = {
        c.info.run_id: max(m.value for m in client.get_metric_history(c.info.run_id, "val/acc")) for c in children
    }
    assert parent.data.metrics["sweep/best"] == pytest.approx(max(best_of.values()))
    winners = [c for c in children if best_of[c.info.run_id] == pytest.approx(max(best_of.values()))]
    assert (parent.data.params["best/optim.lr"], parent.data.params["best/data.batch_size"]) in [
        (c.data.params["optim.lr"], c.data.params["data.batch_size"]) for c in winners
    ]
    assert "hydrali sweep summary: 4 job(s), 0 failed; parent run FINISHED" in out.stdout


def readme_python(after: str) -> str:
    """The README's first ```python block after the line `after`."""
    text = (REPO / "README.md").read_text()
    block = text[text.index(after) :]
    return block[block.index("```python\n") + len("```python\n") : block.index("\n```\n")]


def test_the_readmes_python_snippet_lists_the_newest_sweeps_jobs_when_none_failed(grid):
    root, _ = grid
    snippet = readme_python("In Python, the newest sweep and its jobs, best first:")
    out = subprocess.run([sys.executable, "-c", snippet], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    header, *jobs = out.stdout.strip().splitlines()[1:]
    assert header.split() == ["tags.hydrali.job", "status", "params.optim.lr", "metrics.val/acc", "tags.hydrali.error"]
    assert sorted(line.split()[0] for line in jobs) == ["0", "1", "2", "3"]
    assert all(line.split()[1] == "FINISHED" and line.split()[-1] == "NaN" for line in jobs), jobs


def test_the_parent_holds_the_summary_table_and_two_pictures_with_a_line_per_child(grid):
    root, _ = grid
    client, parents, children = _runs(root)
    parent = parents[0].info.run_id
    assert sorted(a.path for a in client.list_artifacts(parent, "sweep")) == [
        "sweep/metric_per_epoch.png",
        "sweep/params_vs_metric.png",
        "sweep/summary.json",
        "sweep/summary.txt",
    ]
    table = json.loads(_artifact(client, parent, "sweep/summary.json").read_text())
    rows = dict(zip(table["columns"], zip(*table["data"])))
    assert sorted(rows["run_id"]) == sorted(c.info.run_id for c in children)
    assert set(rows["status"]) == {"FINISHED"}
    lines = _artifact(client, parent, "sweep/metric_per_epoch.png")
    assert Image.open(lines).format == "PNG" and _colours_drawn(lines) == 4
    scatter = _artifact(client, parent, "sweep/params_vs_metric.png")
    assert Image.open(scatter).format == "PNG" and Image.open(scatter).width > Image.open(lines).width // 2


def test_hydrali_ui_serves_the_sweep_over_rest_once_it_says_so_and_its_server_dies_with_it(grid):
    """The address line comes once the server answers (before: ~10 s before it did); a `kill -9` of `hydrali ui`
    leaves none of the server's processes (MLflow's server, uvicorn, huey workers) nor the port (before: all stayed)."""
    root, _ = grid
    port = free_port()
    server = start_cli("ui", f"tracking.ui_port={port}", cwd=root, start_new_session=True)
    try:
        ready, _, _ = select.select([server.stdout], [], [], UI_START_WITHIN_S)  # its start, on a loaded machine
        assert ready, f"hydrali ui said nothing in {UI_START_WITHIN_S} s"
        line = server.stdout.readline()
        assert line.startswith("hydrali: MLflow UI: the runs of experiment 'hydrali' are at"), line
        experiments = _rest(port, "experiments/search", {"max_results": 10})["experiments"]  # at once: it answers
        (experiment,) = [e for e in experiments if e["name"] == "hydrali"]
        runs = _rest(port, "runs/search", {"experiment_ids": [experiment["experiment_id"]]})["runs"]
        tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
        parents = {t["mlflow.parentRunId"] for t in tags if "mlflow.parentRunId" in t}
        assert len(runs) == 5 and len(parents) == 1
        below = descendants(server.pid)
        assert any("mlflow" in command for command in below.values()), below
        server.kill()  # SIGKILL: hydrali ui cannot stop its server itself
        server.wait(timeout=60)
        deadline = time.monotonic() + UI_GONE_WITHIN_S
        while any(_alive(pid) for pid in below) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {pid: command for pid, command in below.items() if _alive(pid)}
        assert not left, f"left after {UI_GONE_WITHIN_S} s: {left}"
        with socket.socket() as probe:  # the port is free again (as a server binds it: TIME_WAIT does not count)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=60)


def test_a_failed_job_is_a_failed_child_and_the_sweep_goes_on(tmp_path, data_dir):
    out = _sweep(tmp_path, data_dir, "-m", "data.batch_size=4000,64", "epochs=1", *QUIET_TINY)
    assert out.returncode == 1, out.stderr[-3000:]  # after the other job ran and the table was printed
    assert "hydrali: job 0 failed: data.batch_size=4000 is larger than a shard" in out.stderr
    assert "hydrali sweep summary: 2 job(s), 1 failed" in out.stdout
    assert out.stderr.strip().splitlines()[-1] == (
        "hydrali: error: 1 job(s) of the sweep failed (the table above gives each job's error)"
    )
    client, parents, children = _runs(tmp_path)
    by_batch = {c.data.params["data.batch_size"]: c for c in children}
    failed, finished = by_batch["4000"], by_batch["64"]
    assert failed.info.status == "FAILED" and finished.info.status == "FINISHED"
    assert "data.batch_size=4000 is larger than a shard" in failed.data.tags["hydrali.error"]
    assert "Traceback" in _artifact(client, failed.info.run_id, "error/traceback.txt").read_text()
    assert "val/acc" in finished.data.metrics
    parent = client.get_run(parents[0].info.run_id)
    assert parent.info.status == "FINISHED"
    assert (parent.data.metrics["sweep/jobs"], parent.data.metrics["sweep/failed"]) == (2, 1)
    assert "2 job(s), 1 failed" in _artifact(client, parent.info.run_id, "sweep/summary.txt").read_text()


def test_a_diverging_job_stops_in_its_first_epoch_and_fails_the_sweep(tmp_path, data_dir):
    out = _sweep(tmp_path, data_dir, "-m", "optim.lr=1e6", "epochs=4", *QUIET_TINY)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "train/loss became nan in epoch 1" in out.stderr
    client, parents, (child,) = _runs(tmp_path)
    assert child.info.status == "FAILED" and "diverged" in child.data.tags["hydrali.error"]
    assert [m.step for m in client.get_metric_history(child.info.run_id, "train/loss")] == [1]
    assert client.get_run(parents[0].info.run_id).info.status == "FAILED", "every job failed"


def test_two_sweeps_started_in_the_same_second_keep_their_own_dir_and_parent_run(tmp_path, data_dir):
    # a dir named by the year: both are named alike, as two sweeps started in one second are by default
    timed = "hydra.sweep.dir=multirun/${now:%Y}"
    grids = {"0.05": ["0.05"], "0.2": ["0.2"]}  # one job each: both jobs 0 would share a run dir
    sweeps = [
        start_cli("-m", f"optim.lr={lrs}", "epochs=1", timed, f"paths.data_dir={data_dir}", *QUIET_TINY, cwd=tmp_path)
        for lrs in grids
    ]
    for proc in sweeps:
        assert proc.wait(timeout=600) == 0, proc.communicate()[0][-3000:]
    client, parents, children = _runs(tmp_path)
    dirs = sorted(p.info.run_name for p in parents)
    assert len(parents) == 2 and len(set(dirs)) == 2, dirs
    for parent in parents:
        folder = Path(parent.data.tags["hydrali.sweep_dir"])
        mine = [c for c in children if c.data.tags["mlflow.parentRunId"] == parent.info.run_id]
        lrs = sorted(c.data.params["optim.lr"] for c in mine)
        assert lrs in grids.values() and all(c.info.status == "FINISHED" for c in mine), lrs
        swept = yaml.safe_load((tmp_path / folder / "multirun.yaml").read_text())["hydra"]["overrides"]["task"]
        assert f"optim.lr={','.join(lrs)}" in swept, swept
        assert sorted(p.parent.name for p in (tmp_path / folder).glob("*/summary.json")) == ["0"]
    assert len(children) == 2
    (folder, *_) = sorted(tmp_path.glob("multirun/*"))
    before = sorted(tmp_path.rglob("*"))
    another = run_cli("-m", "optim.lr=0.7", f"hydra.sweep.dir={folder}", f"paths.data_dir={data_dir}", cwd=tmp_path)
    assert another.returncode == 2, another.stderr[-3000:]
    assert (
        another.stderr.strip()
        .splitlines()[-1]
        .startswith(f"hydrali: error: hydra.sweep.dir={folder} holds another sweep (")
    )
    assert sorted(tmp_path.rglob("*")) == before and len(_runs(tmp_path)[1]) == 2


def test_ctrl_c_during_a_sweep_leaves_no_run_running(tmp_path, data_dir):
    proc = start_cli(
        "-m",
        "optim.lr=0.05,0.1",
        "epochs=3",
        f"paths.data_dir={data_dir}",
        *QUIET_TINY,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        preexec_fn=as_from_a_terminal,
    )
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("multirun/*/*/0/history.json")):  # the first job finished an epoch
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 130, stderr[-3000:]
    client, parents, children = _runs(tmp_path)
    assert len(children) == 1 and children[0].info.status == "KILLED"
    assert [p.info.status for p in parents] == ["KILLED"]
    # the stopped job is interrupted (it resumes), not failed: in the table and the parent's counts
    assert "hydrali sweep summary: 1 job(s), 0 failed, 1 interrupted; parent run KILLED" in stdout
    metrics = client.get_run(parents[0].info.run_id).data.metrics
    assert (metrics["sweep/failed"], metrics["sweep/interrupted"]) == (0, 1)


def test_an_optuna_search_of_three_trials_records_the_best_and_survives_a_failed_trial(tmp_path, data_dir):
    # the search space's batch sizes include one larger than the training split: that trial fails
    out = _sweep(
        tmp_path,
        data_dir,
        "hparams_search=classification_optuna",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.params={data.batch_size:'choice(64,4000)'}",
        "hydra.sweeper.sampler.seed=0",
        "epochs=1",
        *QUIET_TINY,
    )
    assert out.returncode == 1, out.stderr[-3000:]  # a trial failed
    # output that is not a terminal (captured here, as a log file or a scheduler's is): Optuna's lines, uncoloured
    assert "A new study created in memory with name: classification" in out.stdout + out.stderr
    assert "\x1b[" not in out.stdout + out.stderr, "a colour code in output that is not a terminal"
    client, parents, children = _runs(tmp_path)
    assert len(children) == 3
    statuses = sorted((c.data.params["data.batch_size"], c.info.status) for c in children)
    assert ("4000", "FAILED") in statuses and ("64", "FINISHED") in statuses, statuses
    assert all(status == ("FAILED" if batch == "4000" else "FINISHED") for batch, status in statuses)
    (results,) = tmp_path.glob("multirun/*/*/optimization_results.yaml")  # Optuna's own record of the study
    optuna_best = yaml.safe_load(results.read_text())
    parent = client.get_run(parents[0].info.run_id)
    assert parent.data.metrics["sweep/best"] == pytest.approx(optuna_best["best_value"])
    for key, value in optuna_best["best_params"].items():
        assert float(parent.data.params[f"best/{key}"]) == pytest.approx(float(value))


def test_a_parallel_joblib_sweep_records_every_job_completely(tmp_path, data_dir):
    out = _sweep(
        tmp_path,
        data_dir,
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "optim.lr=0.05,0.1",
        "epochs=2",
        *QUIET_TINY,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = _runs(tmp_path)
    assert len(parents) == 1 and len(children) == 2
    assert sorted(c.data.params["optim.lr"] for c in children) == ["0.05", "0.1"]
    for child in children:
        assert child.info.status == "FINISHED"
        for key in ("train/loss", "val/acc", "val/loss", "lr/last"):
            assert [m.step for m in client.get_metric_history(child.info.run_id, key)] == [1, 2], key
    parent = client.get_run(parents[0].info.run_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["sweep/jobs"] == 2
