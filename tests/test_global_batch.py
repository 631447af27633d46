"""data.global_batch: a config that fixes the images of an optimizer step (experiment=cifar10 does) trains the same
steps at the same lr on one or several replicas, each replica's batch derived from it; a global batch that does not
divide among the replicas is one line naming the key, with nothing written."""

from __future__ import annotations

import pytest

from hydrali.core.distributed.topology import detect_topology
from hydrali.core.errors import HydraliError
from hydrali.core.run.plan import make_plan
from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import LIGHTNING_QUIET, TINY

PLAN = dict(batch_size=16, base_lr=0.4, ref_batch=512, rule="linear", warmup_epochs=0, epochs=1, device="cpu")


def _topology(replicas: int):
    return detect_topology(replicas_per_node=replicas, num_nodes=1, env={"RANK": "0", "LOCAL_RANK": "0"})


@pytest.mark.parametrize("replicas, per_replica", [(1, 512), (2, 256), (4, 128), (8, 64)])
def test_a_fixed_global_batch_is_split_among_the_replicas_and_keeps_the_lr(replicas, per_replica):
    plan = make_plan(topology=_topology(replicas), seed=0, global_batch=512, **PLAN)
    assert (plan.per_replica_batch, plan.global_batch, plan.effective_lr) == (per_replica, 512, 0.4)
    accumulated = make_plan(topology=_topology(replicas), seed=0, global_batch=512, accumulate=2, **PLAN)
    assert (accumulated.per_replica_batch, accumulated.global_batch) == (per_replica // 2, 512)
    unset = make_plan(topology=_topology(replicas), seed=0, **PLAN)  # data.batch_size per replica, as before
    assert unset.global_batch == 16 * replicas


def test_a_global_batch_that_does_not_divide_is_one_line_naming_it():
    with pytest.raises(HydraliError, match=r"data.global_batch=512 does not divide into 3 replica\(s\): pass a multi"):
        make_plan(topology=_topology(3), seed=0, global_batch=512, **PLAN)
    with pytest.raises(HydraliError, match=r"into 2 replica\(s\) x 3 accumulated batches: pass a multiple of 6"):
        make_plan(topology=_topology(2), seed=0, global_batch=512, accumulate=3, **PLAN)


ARGS = [
    "data.global_batch=32",
    "epochs=1",
    *TINY,
    *LIGHTNING_QUIET,
    "backend.accelerator=cpu",
    "backend.strategy=ddp",
    "tracking=none",
]


@pytest.mark.slow
def test_one_and_two_processes_train_the_same_optimizer_steps_at_the_same_lr(tmp_path, data_dir):
    summaries = {}
    for devices in (1, 2):
        run_dir = tmp_path / f"devices{devices}"
        out = run_cli(
            *ARGS, f"backend.devices={devices}", f"paths.data_dir={data_dir}", f"hydra.run.dir={run_dir}", cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr[-3000:]
        summaries[devices] = read_summary(run_dir)
    one, two = summaries[1], summaries[2]
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["global_batch"] == two["global_batch"] == 32
    assert one["steps_per_epoch"] == two["steps_per_epoch"]
    assert one["history"][0]["train/images"] == two["history"][0]["train/images"]
    assert one["effective_lr"] == two["effective_lr"]
    assert (one["per_replica_batch"], two["per_replica_batch"]) == (32, 16)


@pytest.mark.slow
def test_a_global_batch_two_processes_cannot_share_is_refused_before_anything_is_written(tmp_path, data_dir):
    run_dir = tmp_path / "run"
    out = run_cli(
        *ARGS[1:],
        "data.global_batch=33",
        "backend.devices=2",
        f"paths.data_dir={data_dir}",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    fails_with(out, "data.global_batch=33 does not divide into 2 replica(s)", "multiple of 2")
    assert not run_dir.exists()


@pytest.mark.slow
def test_a_batch_per_replica_given_where_the_config_fixes_the_global_batch_is_one_line(tmp_path, data_dir):
    run_dir = tmp_path / "run"
    out = run_cli(*ARGS, "data.batch_size=8", f"paths.data_dir={data_dir}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    fails_with(out, "data.batch_size=8 would not be used: data.global_batch=32", "data.global_batch=null")
    assert not run_dir.exists()


def test_eval_predict_and_export_read_batches_of_data_batch_size_whatever_training_fixed(make_cfg):
    """hydrali eval, predict and export count their batches by data.batch_size: their pipeline must be built so."""
    from hydrali.core.inference.batches import inference_plan

    cfg = make_cfg("experiment=cifar10", "data.root=unused", "data.batch_size=100")
    assert cfg.data.global_batch == 512
    assert inference_plan(cfg, "cpu").per_replica_batch == 100
