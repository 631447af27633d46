"""A job's processes never outlive it (issue 48, part 5): killed with SIGKILL, the process that started a run's
processes takes them with it within seconds; while any of them lives, its run dir is refused as in use; once they
have ended, the same command resumes the run with each epoch once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hydrali.core.errors import HydraliError
from hydrali.core.run import run_dir
from hydrali.core.run.checkpoints import CHECKPOINT_DIR
from tests.support.checks import read_summary
from tests.support.cli import cli_env, run_cli, start_cli
from tests.support.configs import LIGHTNING_QUIET, TINY
from tests.support.processes import command_line, descendants

ENDED_WITHIN_S = 10  # the bound: no process of the run is left this long after its launcher was killed

# A stand-in for the job's process: it claims the run dir argv[1] as a run does, starts argv[2:] as one of the run's
# processes, prints that process's pid and waits to be killed
LAUNCHER = """
import os, sys, time
from pathlib import Path
from hydrali.core.process import live_processes
from hydrali.core.run import run_dir
with run_dir.claim(Path(sys.argv[1])):
    child = live_processes.start(sys.argv[2:], os.environ, sys.argv[1])
    print(child.pid, flush=True)
    time.sleep(600)
"""
# A process of a run: it ends with its launcher (as each process hydrali starts does first), says so and waits
WATCHING = (
    "from hydrali.core.process import live_processes; live_processes.stop_with_launcher(); "
    "print('watching', flush=True); import time; time.sleep(600)"
)
# A process of a run that would live on (as one did before it watched its launcher)
NOT_WATCHING = "print('started', flush=True); import time; time.sleep(600)"


def _alive(pid: int, command: str) -> bool:
    """Whether process `pid` still runs `command` (a zombie, or another program under a reused pid, is not alive)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" and command_line(pid) == command
    except (OSError, IndexError):
        return False


def _left_after(processes: dict[int, str], seconds: float) -> dict[int, str]:
    """Those of `processes` still alive after up to `seconds` (sooner when none is)."""
    deadline = time.monotonic() + seconds
    while (left := {p: c for p, c in processes.items() if _alive(p, c)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _kill(processes: dict[int, str]) -> None:
    """The test's own clean-up: SIGKILL each of `processes` that still runs its command."""
    for pid, command in processes.items():
        if _alive(pid, command):
            os.kill(pid, signal.SIGKILL)


def _start_launcher(out: Path, child_code: str) -> tuple[subprocess.Popen, dict[int, str]]:
    """The stand-in launcher, holding `out` and running `child_code` as its run's process, once that process has
    said its first line (it writes to the launcher's output): (the launcher, {the process's pid: its command})."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(out), sys.executable, "-c", child_code],
        env=cli_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    line = launcher.stdout.readline()  # the process's pid
    assert line.strip().isdigit(), f"the launcher did not start its process: {line!r}"
    said = launcher.stdout.readline()
    assert said in ("watching\n", "started\n"), f"the process did not start: {said!r}"
    return launcher, {int(line): command_line(int(line))}


def _in_use(out: Path) -> bool:
    """Whether a run in `out` is refused as in use now."""
    try:
        with run_dir.claim(out):
            return False
    except HydraliError as err:
        assert "is in use" in str(err), err
        return True


def test_a_process_of_a_run_ends_within_seconds_when_its_launcher_is_killed(tmp_path):
    out = tmp_path / "run"
    launcher, process = _start_launcher(out, WATCHING)  # it watches its launcher from now on
    try:
        assert all(_alive(pid, command) for pid, command in process.items()) and _in_use(out)
        launcher.kill()
        launcher.wait()
        left = _left_after(process, ENDED_WITHIN_S)
    finally:
        launcher.kill()
        launcher.stdout.close()
        _kill(process)
    assert not left, f"still running {ENDED_WITHIN_S} s after its launcher was killed"
    assert not _in_use(out), "the run dir is free once its processes have ended"


def test_a_run_dir_whose_process_outlived_its_launcher_is_refused_as_in_use_with_nothing_changed(tmp_path, data_dir):
    out = tmp_path / "run"
    launcher, process = _start_launcher(out, NOT_WATCHING)
    try:
        launcher.kill()
        launcher.wait()
        assert all(_alive(pid, command) for pid, command in process.items()), "it outlived its launcher"
        (out / "history.json").write_text('{"history": []}\n')  # what the run has written so far
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        args = ["epochs=1", *TINY, *LIGHTNING_QUIET, f"paths.data_dir={data_dir}", f"hydra.run.dir={out}"]
        again = run_cli(*args, cwd=tmp_path)
        assert again.returncode == 2, again.stderr[-3000:]
        assert again.stderr.strip().splitlines() == [
            f"hydrali: error: hydra.run.dir={out} is in use: another hydrali process is running in it; wait for it "
            f"to end (then ckpt_path=last resumes it if it was interrupted), or pass another hydra.run.dir"
        ]
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "nothing changed in the run dir"
        assert not (tmp_path / "mlflow.db").exists(), "nor in MLflow"
    finally:
        launcher.stdout.close()
        _kill(process)
    assert _left_after(process, ENDED_WITHIN_S) == {}
    assert not _in_use(out), "the run dir is free once its last process has ended"


# last.ckpt appears (a hard link made whole, backends/lightning/callbacks.py LastCheckpoint) once an epoch's record,
# MLflow's included, and checkpoint are written: the next epoch is training
LAST_CHECKPOINT = Path(CHECKPOINT_DIR) / "last.ckpt"
RANK_PROCESS = "hydrali.core.cli.launched"  # in the command line of each process hydrali starts for a job


@pytest.mark.slow
def test_a_sigkilled_launcher_of_two_processes_leaves_none_and_the_same_command_resumes_each_epoch_once(
    tmp_path, data_dir
):
    out, epochs = tmp_path / "run", 3
    args = [
        "backend.accelerator=cpu",
        "backend.devices=2",
        f"epochs={epochs}",
        *TINY,
        "data.image_size=32",  # epochs of about 2 s: the kill lands well inside the second
        *LIGHTNING_QUIET,
        f"paths.data_dir={data_dir}",
        f"hydra.run.dir={out}",
    ]
    log = tmp_path / "first.log"  # the killed command's output (and its processes'), read when the test fails
    with log.open("w") as sink:
        first = start_cli(*args, cwd=tmp_path, stdout=sink)
    processes: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 300
        while not (out / LAST_CHECKPOINT).exists():  # the first epoch is recorded and saved
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        processes = descendants(first.pid)
        assert sum(RANK_PROCESS in command for command in processes.values()) == 2, processes
        first.kill()  # `kill -9` of the hydrali command
        first.wait()
        left = _left_after(processes, ENDED_WITHIN_S)
        assert not left, f"{ENDED_WITHIN_S} s after `kill -9 {first.pid}`, still running: {sorted(left.values())}"
    finally:
        first.kill()
        _kill(processes)

    again = run_cli(*args, cwd=tmp_path)  # the same command: resumes from the newest checkpoint
    assert again.returncode == 0, again.stderr[-3000:]
    summary = read_summary(out)
    assert summary["first_epoch"] == 2, "resumed at the epoch the kill interrupted"
    rows = summary["history"]
    assert [row["epoch"] for row in rows] == list(range(1, epochs + 1)), "each epoch once in history.json"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    for key in sorted(set().union(*rows) - {"epoch"}):
        steps = [metric.step for metric in client.get_metric_history(summary["mlflow_run_id"], key)]
        assert sorted(steps) == list(range(1, epochs + 1)), f"{key}: each epoch once in MLflow"
