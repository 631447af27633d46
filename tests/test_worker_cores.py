"""pipeline.worker_cores: DALI's worker threads kept off the core of the training process's main thread, as the OS
reports them (/proc), on both backends; the rule that decides it."""

from __future__ import annotations

import json
import os

import pytest

from hydrali.core.data import affinity
from hydrali.core.run.runner import run
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, SMALL_NET, with_plugin_callback


def test_auto_spares_a_core_on_gpus_of_one_replica_processes_only():
    assert affinity.decide("auto", "gpu", 1) == "spare"
    assert affinity.decide("auto", "cpu", 1) == "any", "on a CPU the training wants every core"
    assert affinity.decide("auto", "gpu", 2) == "any", "pipelines of 2 replicas would share their first cores"
    assert affinity.decide("spare", "cpu", 1) == "spare" and affinity.decide("any", "gpu", 1) == "any"


def test_each_process_of_a_node_gets_its_own_cores_and_keeps_one_for_its_main_thread():
    machine = list(range(16))
    shares = [affinity.process_share(machine, 16, rank, 4) for rank in range(4)]
    assert shares == [list(range(4 * r, 4 * r + 4)) for r in range(4)], "4 DDP processes, 4 cores each"
    assert affinity.worker_cores(shares[1]) == [5, 6, 7], "core 4 is kept for rank 1's main thread"
    assert affinity.process_share([2, 3], 16, 3, 8) == [2, 3], "a launcher bound the process: its cores"
    assert affinity.process_share(machine, 16, 0, 1) == machine
    assert affinity.worker_cores([7]) is None, "one core cannot be split"


@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])
def test_spare_pins_dali_s_workers_off_the_main_thread_s_core(make_cfg, tmp_path, caplog, backend):
    """pipeline.worker_cores=spare on a CPU run (auto would leave CPU pipelines to the OS): every DALI worker thread
    may run only on this process's cores but the first, as the OS reports after the first step."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.fail("this test needs a process with at least 2 cores (CI's machine has 2)")
    seen = tmp_path / "cores.json"
    quiet = LIGHTNING_QUIET if backend == "lightning" else KERAS_QUIET
    cfg = make_cfg(
        *SMALL_NET,
        *quiet,
        f"backend={backend}",
        "pipeline=light",
        "pipeline.num_threads=3",
        "pipeline.worker_cores=spare",
        "epochs=1",
        "tracking=none",
        "data.verify=off",
        with_plugin_callback("cores", "RecordWorkerCores", path=str(seen), framework=backend),
        output_dir=tmp_path / "run",
    )
    earlier = set(affinity.worker_thread_cores())  # DALI threads of pipelines that earlier tests left alive
    with caplog.at_level("INFO", logger="hydrali"):
        run(cfg)
    recorded = json.loads(seen.read_text())
    threads = {tid: c for tid, c in recorded["threads"].items() if tid not in earlier}
    assert recorded["process"] == cores, "the training process itself is not pinned"
    assert len(threads) >= 3, f"the training pipeline's 3 workers were seen: {recorded}"
    assert all(set(c) <= set(cores[1:]) for c in threads.values()), recorded
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pipeline.worker_cores")]
    assert lines and f"core {cores[0]} kept for the main thread" in lines[0], lines


def test_the_framework_gets_the_cores_dali_s_training_workers_leave_on_a_cpu_run():
    quiet = {}  # no OMP_NUM_THREADS / TF_NUM_INTRAOP_THREADS set by a caller
    assert affinity.framework_threads("auto", "cpu", 2, 1, 2, quiet) == 1, "CI's 2 cores, DALI's 2 workers"
    assert affinity.framework_threads("auto", "cpu", 4, 1, 16, quiet) == 12
    assert affinity.framework_threads("auto", "cpu", 4, 2, 16, quiet) == 8, "two replicas' pipelines in one process"
    assert affinity.framework_threads("auto", "cpu", 8, 1, 4, quiet) == 1, "at least one"
    assert affinity.framework_threads("auto", "gpu", 4, 1, 16, quiet) is None, "a GPU run keeps the default"
    assert affinity.framework_threads("auto", "cpu", 2, 1, 8, {"OMP_NUM_THREADS": "3"}) is None, "the caller's stays"
    assert affinity.framework_threads(3, "gpu", 4, 1, 16, quiet) == 3, "a number is every run's"
