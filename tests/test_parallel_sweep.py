"""A sweep on a machine with several GPUs (hydra/launcher=hydrali, the default of -m): jobs at once, each on GPUs of
its own, the next job on the GPUs that free up first, a failed job's included; Ctrl+C or SIGTERM stops every job,
each resumable, and the sweep started again in its dir goes on. This machine has no GPU: the sweep is given GPU ids
(hydra.launcher.gpus), which each job's process receives as CUDA_VISIBLE_DEVICES, and trains on the CPU."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hydrali.core.distributed.gpu_placement import plan
from hydrali.tasks.classification.datasets import write_digits
from tests.support.checks import fails_with, read_summary
from tests.support.cli import as_from_a_terminal, run_cli, start_cli
from tests.support.configs import LIGHTNING_QUIET, TINY, with_plugin_callback

TWO_GPUS = "hydra.launcher.gpus=[0,1]"
STOP_WITHIN_S = 300
POLL_S = 0.05


def test_the_gpus_are_cut_into_disjoint_slots_of_a_jobs_size():
    assert plan(["0", "1", "2", "3"], 1).slots == (("0",), ("1",), ("2",), ("3",))
    assert plan(["0", "1", "2", "3", "4"], 2).slots == (("0", "1"), ("2", "3"))  # GPU 4 stays idle
    assert plan(["5", "7"], 1).slots == (("5",), ("7",))  # CUDA_VISIBLE_DEVICES' own ids
    assert not plan(["0"], 1).parallel and not plan([], 1).parallel  # one GPU or none: one job after another
    assert not plan(["0", "1", "2"], 2).parallel  # a job asking for most of the GPUs: one slot


def _gpus_of_jobs(sweep: Path) -> dict[int, str]:
    """The GPUs each job's process saw (its CUDA_VISIBLE_DEVICES), from the first line of its console log."""
    seen = {}
    for log in sweep.glob("*.console.log"):
        match = re.match(r"hydrali: job (\d+) on GPUs (\S*):", log.read_text())
        assert match, log.read_text()[:500]
        seen[int(match.group(1))] = match.group(2)
    return seen


@pytest.mark.slow
def test_jobs_run_at_once_on_gpus_of_their_own_and_a_failed_jobs_gpu_takes_the_next(tmp_path, data_dir, digits_copy):
    """Job 0 trains, job 1 fails at once (a file that does not decode), job 2 starts on job 1's GPU while job 0
    still holds the other; the sweep reports the failure and exits 1."""
    sys_digits = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    broken = sorted((digits_copy / "val" / "7").glob("*.jpg"))[2]
    broken.write_bytes(broken.read_bytes()[:200])
    sweep = tmp_path / "sweep"
    out = run_cli(
        "-m",
        "data=imagefolder",
        f"data.root={sys_digits},{digits_copy},{sys_digits}",
        "epochs=3",
        *TINY,
        *LIGHTNING_QUIET,
        TWO_GPUS,
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert "hydrali: jobs 0-2 of the sweep: 2 jobs at once, on GPUs 0 | 1" in out.stdout
    gpus = _gpus_of_jobs(sweep)
    assert {gpus[0], gpus[1]} == {"0", "1"}, gpus  # at once, disjoint, every GPU used
    assert gpus[2] == gpus[1], f"job 2 takes the GPU job 1 freed: {gpus}"
    assert re.search(r"hydrali: job 1 ended on GPUs \d after \d+ s: failed", out.stdout), out.stdout
    assert "cannot decode" in (sweep / "1.console.log").read_text()
    for job in (0, 2):
        assert [row["epoch"] for row in read_summary(sweep / str(job))["history"]] == [1, 2, 3]
    assert "1 job(s) of the sweep failed" in out.stderr


def _left_in_group(group: int, within_s: float = 10.0) -> list[str]:
    """The processes of process group `group` still running after `within_s` seconds (multiprocessing's resource
    tracker ends a moment after the process it served; ended ones not yet reaped do not count)."""
    deadline = time.monotonic() + within_s
    while True:
        listed = subprocess.run(["pgrep", "-a", "-g", str(group)], capture_output=True, text=True).stdout
        left = [line for line in listed.splitlines() if not line.endswith("<defunct>")]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(POLL_S)


def _runs(root: Path):
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parents, {r.data.tags["hydrali.job"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}


STOPS = {  # how the sweep is stopped, its jobs, and the jobs training (the others finished) when it is
    "SIGINT": ("optim.lr=0.05,0.1", ("0", "1")),
    "SIGTERM": ("optim.lr=0.05,0.1", ("0", "1")),
    "SIGINT with a worker idle": ("optim.lr=0.05,0.1,0.2", ("2",)),  # job 2 trains, the other worker waits
}


@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS, ids=list(STOPS))
def test_a_parallel_sweep_stopped_stops_every_job_resumable_and_goes_on_when_started_again(tmp_path, data_dir, stop):
    """Ctrl+C (SIGINT to the terminal's whole process group) or SIGTERM (to the sweep's process alone, as a scheduler
    sends it) while jobs train: exit 130, every training job's run KILLED with its epochs kept, the finished ones
    FINISHED, no worker left (an idle one included); the same command again resumes the stopped jobs in their own
    runs and ends with the parent FINISHED."""
    grid, training = STOPS[stop]
    how = stop.split()[0]
    sweep = tmp_path / "sweep"
    args = ["-m", grid, "epochs=5", *TINY, *LIGHTNING_QUIET, f"paths.data_dir={data_dir}"]
    args += [TWO_GPUS, f"hydra.sweep.dir={sweep}"]
    log = tmp_path / "first.log"
    with log.open("w") as output:
        first = start_cli(*args, cwd=tmp_path, stdout=output, preexec_fn=lambda: (as_from_a_terminal(), os.setpgrp()))
        deadline = time.monotonic() + STOP_WITHIN_S
        finished = [str(job) for job in range(len(grid.split(","))) if str(job) not in training]
        while not (  # a checkpoint each, the jobs that finish before the stop finished (a worker idle)
            all(any((sweep / job / "checkpoints").glob("epoch*")) for job in training)
            and all((sweep / job / "summary.json").exists() for job in finished)
        ):
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(POLL_S)
        if how == "SIGINT":
            os.killpg(first.pid, signal.SIGINT)
        else:
            first.send_signal(signal.SIGTERM)
        first.wait(timeout=STOP_WITHIN_S)
    assert first.returncode == 130, log.read_text()[-3000:]
    assert not _left_in_group(first.pid), "processes of the sweep still running"
    parents, children = _runs(tmp_path)
    assert [p.info.status for p in parents] == ["KILLED"]
    assert {job: run.info.status for job, run in children.items()} == {
        job: "KILLED" if job in training else "FINISHED" for job in children
    }
    assert len(children) == len(grid.split(","))

    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"hydrali sweep summary: {len(children)} job(s), 0 failed; parent run FINISHED" in again.stdout
    for job in children:
        resumed = "resuming from its newest checkpoint" in (sweep / job / "hydrali.log").read_text()
        assert resumed == (job in training), job
        assert [row["epoch"] for row in read_summary(sweep / job)["history"]] == [1, 2, 3, 4, 5]
    parents_now, children_now = _runs(tmp_path)
    assert [(p.info.run_id, p.info.status) for p in parents_now] == [(parents[0].info.run_id, "FINISHED")]
    assert {job: (run.info.run_id, run.info.status) for job, run in children_now.items()} == {
        job: (run.info.run_id, "FINISHED") for job, run in children.items()
    }, "each stopped job went on in its own MLflow run"


@pytest.mark.slow
def test_a_workers_next_job_reuses_its_decoded_splits_and_trains_as_the_same_job_alone(tmp_path, data_dir):
    """experiment=cifar10 (decode_once) on the digits, a sweep over seeds: job 2 runs in a worker that decoded the
    splits for its first job, of another seed, and takes them from memory (the decoded images and their order do not
    depend on the seed, which draws each pass's permutation); its history is exactly that of the same command run
    alone."""
    digits = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    common = ["experiment=cifar10", f"data.root={digits}", "epochs=2", "model.widths=[8,16,32,64]", "tracking=none"]
    sweep = tmp_path / "sweep"
    out = run_cli("-m", *common, "seed=1,2,3", TWO_GPUS, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "decoded once by an earlier run of this process, kept in memory" in (sweep / "2" / "hydrali.log").read_text()
    alone = tmp_path / "alone"
    out = run_cli(*common, "seed=3", f"hydra.run.dir={alone}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "kept in memory" not in (alone / "hydrali.log").read_text()
    assert read_summary(sweep / "2")["history"] == read_summary(alone)["history"]


@pytest.mark.parametrize(
    "setting, words",
    [
        ("hydra.launcher.gpus=[0,0]", "give distinct GPU ids"),
        ("hydra.launcher.gpus_per_job=0", "hydra.launcher.gpus_per_job=0: give a number of GPUs, at least 1"),
    ],
)
def test_a_launcher_setting_that_cannot_place_jobs_is_one_line_and_writes_nothing(tmp_path, setting, words):
    sweep = tmp_path / "sweep"
    fails_with(run_cli("-m", "optim.lr=0.1,0.2", setting, f"hydra.sweep.dir={sweep}", cwd=tmp_path), words)
    assert not sweep.exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_a_worker_killed_by_the_system_fails_its_job_alone_and_the_jobs_beside_it_resume(tmp_path, data_dir):
    """Job 1's process is SIGKILLed (as the out-of-memory killer does) at the end of its third epoch, every time it
    runs; loky stops the pool's other worker with it. Job 0, stopped beside it, runs again by itself and resumes
    from its checkpoint; job 1, run by itself, dies again and is the sweep's one failed job; job 2 runs; exit 1.
    (8 epochs a job: job 0 is still training when job 1 dies, even when one worker starts seconds after the other,
    as on a loaded machine.)"""
    sweep = tmp_path / "sweep"
    kill = with_plugin_callback("kill", "KillOwnProcess", job="1", epoch="3")
    out = run_cli(
        "-m",
        "optim.lr=0.05,0.1,0.2",
        "epochs=8",
        *TINY,
        *LIGHTNING_QUIET,
        f"paths.data_dir={data_dir}",
        TWO_GPUS,
        kill,
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(r"hydrali: a worker process died \(exit codes .*SIGKILL.*\) while jobs 0, 1 ran", out.stdout)
    assert "hydrali: job 1 failed: its worker process died (exit codes {SIGKILL(-9)}" in out.stdout, out.stdout
    assert "1 job(s) of the sweep failed" in out.stderr
    assert "resuming from its newest checkpoint" in (sweep / "0" / "hydrali.log").read_text()
    for job in ("0", "2"):
        assert [row["epoch"] for row in read_summary(sweep / job)["history"]] == list(range(1, 9)), job
    assert not (sweep / "1" / "summary.json").exists()
    _, children = _runs(tmp_path)
    statuses = {job: run.info.status for job, run in children.items()}
    assert statuses == {"0": "FINISHED", "1": "FAILED", "2": "FINISHED"}, out.stdout[-2000:]


def test_a_workers_backend_is_imported_while_its_first_job_checks_its_data():
    """A worker starts importing its backend's framework as it takes its GPUs, so that its first job's config and
    data check run meanwhile; the run's own load then finds the framework imported (in a fresh process here)."""
    code = (
        "import sys\n"
        "from hydrali.core.contracts.registry import import_ahead, load_backend\n"
        "assert 'torch' not in sys.modules\n"
        "thread = import_ahead('lightning')\n"
        "alive = thread.is_alive()\n"  # this thread goes on while torch is imported
        "again, unknown = import_ahead('lightning'), import_ahead('nothing')\n"
        "thread.join()\n"
        "print(alive, again, unknown, 'torch' in sys.modules, 'lightning' in sys.modules)\n"
        "print(type(load_backend('lightning')).__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["True None None True True", "hydrali.backends.lightning.backend"]


def test_a_worker_that_keeps_memory_between_jobs_runs_the_sweeps_next_jobs(tmp_path, data_dir):
    """Each job keeps 400 MB in its worker (as a worker keeps a job's decoded splits for the next): the 6 jobs still
    run in the 2 workers the sweep started, none replaced (loky, where psutil is installed, replaces a worker that
    grew 300 MB past its size after its first job: its third job would run in a fresh one)."""
    sweep = tmp_path / "sweep"
    out = run_cli(
        "-m",
        "optim.lr=0.05,0.1,0.2,0.3,0.4,0.5",
        "epochs=1",
        *TINY,
        *LIGHTNING_QUIET,
        f"paths.data_dir={data_dir}",
        "tracking=none",
        TWO_GPUS,
        with_plugin_callback("hold", "HoldMemory", mb="400"),
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    workers = {job: (sweep / str(job) / "worker.pid").read_text() for job in range(6)}
    assert len(set(workers.values())) == 2, workers
    assert "A worker stopped" not in out.stderr
