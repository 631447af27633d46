"""backend=keras with backend.processes=per_device: hydrali starts a process per device (as for Lightning's DDP),
each a worker of MultiWorkerMirroredStrategy driving one replica, and the run is the one that a single process
driving the same replicas trains (MirroredStrategy): the same losses and accuracies at every epoch. On the CPU, the
devices are backend.devices logical CPUs."""

from __future__ import annotations

import pytest

from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, TINY

pytestmark = pytest.mark.keras


@pytest.mark.slow
def test_a_process_per_device_trains_exactly_as_one_process_driving_the_replicas(tmp_path, data_dir):
    common = ["backend=keras", "backend.devices=2", "epochs=2", "tracking=none", *TINY, *KERAS_QUIET]
    common += [f"paths.data_dir={data_dir}"]
    histories, outputs = {}, {}
    for processes in ("one", "per_device"):
        run_dir = tmp_path / processes
        out = run_cli(*common, f"backend.processes={processes}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        outputs[processes] = out.stdout + out.stderr
        summary = read_summary(run_dir)
        assert summary["world_size"] == 2 and summary["global_batch"] == 2 * summary["per_replica_batch"]
        histories[processes] = [{k: v for k, v in row.items() if "/" in k} for row in summary["history"]]
    assert histories["per_device"] == histories["one"]
    per_device = tmp_path / "per_device"
    assert (per_device / "hydrali_rank1.log").is_file(), "the second process's log beside the first's"
    assert "starting 2 process(es)" in outputs["per_device"] and "starting 2 process(es)" not in outputs["one"]
    assert [p.name for p in (per_device / "checkpoints").glob("*.weights.h5")] == ["epoch002.weights.h5"]


def test_an_unknown_choice_of_processes_is_one_line(tmp_path, data_dir):
    out = run_cli("backend=keras", "backend.processes=two", f"paths.data_dir={data_dir}", "epochs=1", cwd=tmp_path)
    fails_with(out, "backend.processes=two", "one or per_device")
    assert not (tmp_path / "outputs").exists()
