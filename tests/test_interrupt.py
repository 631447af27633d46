"""Ctrl+C during an epoch ends the same way on both backends: one line, exit code 130, the run KILLED, resumable."""

import json
import signal
import subprocess
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.support.checks import read_summary
from tests.support.cli import as_from_a_terminal, run_cli, start_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET

pytestmark = pytest.mark.slow
QUIET = {"lightning": LIGHTNING_QUIET, "keras": KERAS_QUIET}


@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_ctrl_c_during_an_epoch_exits_130_marks_the_run_killed_and_resumes(tmp_path, data_dir, backend):
    out = tmp_path / "run"
    args = [f"backend={backend}", "epochs=2", f"paths.data_dir={data_dir}", f"hydra.run.dir={out}", *QUIET[backend]]
    proc = start_cli(*args, cwd=tmp_path, stderr=subprocess.PIPE, preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 300
    while not (out / "history.json").exists():  # written when the first epoch ends
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    time.sleep(1.5)  # well inside the second epoch
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=180)

    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "Detected KeyboardInterrupt" not in stderr + stdout, "Lightning's line beside hydrali's"
    assert [line for line in stderr.splitlines() if line.startswith("hydrali:")] == [
        f"hydrali: interrupted: the run is marked KILLED; resume it with ckpt_path=last hydra.run.dir={out}"
    ]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = json.loads((out / "run.json").read_text())["mlflow_run_id"]
    assert client.get_run(run_id).info.status == "KILLED"

    resumed = run_cli(*args, "ckpt_path=last", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = read_summary(out)
    assert [row["epoch"] for row in summary["history"]] == [1, 2] and summary["first_epoch"] == 2
    assert summary["mlflow_run_id"] == run_id and client.get_run(run_id).info.status == "FINISHED"
