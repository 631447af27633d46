"""Leftovers and noise (issue 36, case 6): `hydrali ui` starts with one line and a kill stops all its processes;
a Keras export prints no NumPy warning; a second predict names the predictions it replaces; "1 image"."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.support.cli import free_port, run_cli, start_cli
from tests.support.processes import descendants

pytestmark = pytest.mark.slow


def _alive(pid: int, command: str) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        same = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()) == command
    except OSError:
        return False
    return same and state != "Z"


def test_hydrali_ui_says_one_line_and_a_kill_stops_every_process_it_started(tmp_path):
    MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").create_experiment("hydrali")
    port = free_port()
    ui = start_cli("ui", f"tracking.ui_port={port}", cwd=tmp_path, start_new_session=True)
    try:
        first = ui.stdout.readline()
        assert first.startswith("hydrali: MLflow UI: the runs of experiment 'hydrali' are at"), first
        deadline, started = time.monotonic() + 180, {}
        while True:  # until the server answers and MLflow's job runner has started its huey consumers
            assert ui.poll() is None and time.monotonic() < deadline, "the UI did not start in 180 s"
            started = descendants(ui.pid)
            if any("huey_consumer" in c for c in started.values()):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()
                    break
                except OSError:
                    pass
            time.sleep(1)
        time.sleep(3)  # every uvicorn worker has started (each warned about starlette before)
        started = descendants(ui.pid)
        os.kill(ui.pid, signal.SIGTERM)  # `kill <pid>`
        rest, _ = ui.communicate(timeout=60)
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
    assert rest.strip() == "", f"more than the one line: {rest[-3000:]}"
    deadline = time.monotonic() + 15
    while (left := {p: c for p, c in started.items() if _alive(p, c)}) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:  # the test's own clean-up; the assertion below says what lived on
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after `kill {ui.pid}`: {sorted(left.values())}"


@pytest.mark.keras
def test_keras_export_prints_no_numpy_warning(trained_on_both, tmp_path):
    out = run_cli("export", str(trained_on_both[0] / "keras"), "format=onnx", f"out={tmp_path}/onnx", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "FutureWarning" not in out.stdout + out.stderr, out.stderr[-3000:]


def test_a_second_predict_names_the_predictions_it_replaces_and_one_image_is_one_image(
    trained_on_both, data_dir, tmp_path
):
    source = tmp_path / "photos"
    source.mkdir()
    image = next((data_dir / "digits" / "val" / "3").iterdir())
    (source / image.name).write_bytes(image.read_bytes())
    args = ("predict", str(trained_on_both[0] / "lightning"), f"source={source}", f"out={tmp_path}/out")
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"1 image of {source} predicted" in first.stdout.splitlines()
    assert "replaced" not in first.stdout
    written = (tmp_path / "out/predictions.csv").read_text()

    second = run_cli(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    replaced = [line for line in second.stdout.splitlines() if line.startswith("replaced")]
    assert replaced == [
        f"replaced (an earlier prediction's; pass out=DIR to keep both): {tmp_path}/out/predictions.csv"
    ], second.stdout
    assert (tmp_path / "out/predictions.csv").read_text() == written
