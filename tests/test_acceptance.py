"""bench/gpu/acceptance.py, the GPU acceptance check, on the CPU: every row's commands compose into hydrali configs
that train the same global batch on 1 and on 2 GPUs, and the verdict fails a row whose 2-GPU result falls below its
1-GPU result by more than its tolerance, a failed run or a stream warning (the GPU machine runs the check itself)."""

from __future__ import annotations

import pytest

from hydrali.bench.gpu.acceptance import MORE_GPU_COUNTS, Result, Side, command, rows_of, table, verdict
from hydrali.core.distributed.topology import detect_topology
from hydrali.core.run.plan import plan_of_config


@pytest.mark.parametrize("tier", ["quick", "full"])
def test_every_rows_runs_compose_and_train_one_global_batch_on_1_and_2_gpus(make_cfg, tmp_path, tier):
    rows, seeds = rows_of(tier, None)
    assert rows and seeds[0] == 42
    for row in rows:
        global_batches = set()
        for gpus in MORE_GPU_COUNTS:
            cmd = command(row, "lightning", gpus, seeds[0], tmp_path / "run", cifar_root=str(tmp_path / "cifar"))
            overrides = [o for o in cmd[3:] if not o.startswith("hydra.run.dir=")]
            cfg = make_cfg(*overrides)
            topology = detect_topology(gpus, 1, env={"RANK": "0", "LOCAL_RANK": "0"})
            global_batches.add(plan_of_config(cfg, topology, seed=seeds[0], device="gpu").global_batch)
            assert cfg.backend.devices == gpus
        assert len(global_batches) == 1, (row["name"], global_batches)


def _side(*bests, warned=False) -> Side:
    return Side([Result(best, 10.0, 100.0, warned, "log") for best in bests])


def test_the_verdict_holds_within_the_tolerance_and_names_what_failed():
    row = {"name": "r", "tolerance": 0.01}
    assert verdict(row, _side(0.915, 0.917), _side(0.910)) == "ok"
    assert verdict(row, _side(0.917), _side(0.43)) == "BELOW by 0.4870"
    assert verdict(row, _side(0.917), _side(None)) == "FAILED RUN"
    assert verdict(row, _side(0.917), _side(0.917, warned=True)) == "STREAM WARNING"
    assert verdict(row, _side(), _side()) == "NO RUNS"
    # --gpu-counts 1: a row's spread on one GPU, not compared (and not "ok": a check of both sides never sees it)
    assert verdict(row, _side(0.915, 0.917), _side()) == "1 GPU only"
    assert verdict(row, _side(), _side(0.915)) == "N GPUs only"
    assert verdict(row, _side(0.915, None), _side()) == "FAILED RUN"
    # a floor: a regression that hits 1 and N GPUs alike (within the tolerance of each other) fails the row
    floored = {**row, "floor": 0.87}
    assert verdict(floored, _side(0.915), _side(0.913)) == "ok"
    assert verdict(floored, _side(0.85), _side(0.849)) == "UNDER 0.87 (0.8500)"
    assert verdict(floored, _side(0.85), _side()) == "UNDER 0.87 (0.8500)"  # one GPU alone too
    sides = {("r", "lightning", 1): _side(0.915, 0.919), ("r", "lightning", 2): _side(0.43)}
    lines = table([row], sides, ["lightning"]).splitlines()
    assert lines[-1].startswith("| r | lightning | 2 | 2 / 1 | 0.9170 (0.9150-0.9190) | 0.4300 | 0.01 |")
    assert lines[-1].endswith("| BELOW by 0.4870 |")
    # on a 4-GPU machine: 2 and 4 GPUs, each against 1 GPU
    sides["r", "lightning", 4] = _side(0.916)
    lines = table([row], sides, ["lightning"], (1, 2, 4)).splitlines()
    assert [line.split(" | ")[2] for line in lines[2:]] == ["2", "4"]
    assert lines[-1].startswith("| r | lightning | 4 | 2 / 1 | 0.9170 (0.9150-0.9190) | 0.9160 |")
    assert lines[-1].endswith("| ok |")
    # one count alone: its spread, nothing compared
    [line] = table([row], sides, ["lightning"], (1,)).splitlines()[2:]
    assert line.startswith("| r | lightning | 1 | 2 / 0 | 0.9170 (0.9150-0.9190) | - |") and line.endswith(
        "1 GPU only |"
    )
