"""The benchmark's training measurements on this machine's CPU (hydrali-bench's training sections need a GPU;
these are the parts of them that do not): a timed run through hydrali itself on both backends, which trains
its warm-up and timed steps, then stops, and gives the timed window's images/s; the plain torch loop from
either feed, with the backend's lr schedule and Lightning's own precision; Keras' own bound."""

from __future__ import annotations

import json

import pytest
import torch

from hydrali.bench.section_base import plain
from hydrali.bench.training import HydraliTraining
from hydrali.core.errors import HydraliError
from tests.support.configs import SMALL_NET

pytestmark = pytest.mark.slow
BATCH = 8


def history(run_dir) -> list[dict]:
    """The run record's rows, as the run wrote them."""
    return json.loads((run_dir / "history.json").read_text())["history"]


@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_a_timed_run_trains_its_warm_up_and_timed_steps_then_stops(backend, make_cfg, tmp_path):
    cfg = make_cfg(f"backend={backend}", "tracking.enabled=false", *SMALL_NET, f"data.batch_size={BATCH}")
    training = HydraliTraining(plain(cfg), backend, str(tmp_path / "runs"), warmup=2, steps=3)

    first, second = training.once(), training.once()

    assert first.images_per_s > 0 and second.images_per_s > 0
    if backend == "lightning":  # steps timed one by one (the host's clock on the CPU)
        assert first.median_step_images_per_s > 0 and second.median_step_images_per_s > 0
    for repeat in (1, 2):  # each repeat is a run of its own, stopped within its first epoch after 2 + 3 steps
        rows = history(tmp_path / "runs" / f"{backend}-r{repeat}")
        assert len(rows) == 1 and rows[0]["train/images"] == (2 + 3) * BATCH


def test_an_epoch_shorter_than_the_window_is_one_error_naming_the_settings(make_cfg, tmp_path):
    cfg = make_cfg("tracking.enabled=false", *SMALL_NET, f"data.batch_size={BATCH}")
    training = HydraliTraining(plain(cfg), "lightning", str(tmp_path / "runs"), warmup=2, steps=10_000)

    with pytest.raises(HydraliError, match=r"bench\.train\.warmup / bench\.train\.steps"):
        training.once()


@pytest.mark.parametrize("feed", ["tensors", "dali"])
def test_the_plain_torch_loop_trains_the_tasks_network_from_either_feed(feed, make_cfg):
    from hydra.utils import instantiate

    from hydrali.bench.loaders import one_replica_plan
    from hydrali.bench.torch_loops import TorchLoop
    from hydrali.core.optim.schedule import lr_factor

    cfg = make_cfg(*SMALL_NET, f"data.batch_size={BATCH}", "pipeline.device=cpu", "optim.warmup_epochs=1")
    task = instantiate(cfg.task)
    dataset = task.prepare_data(cfg.data, verify="off")
    plan = one_replica_plan(cfg, dataset, "cpu")
    loop = TorchLoop(task, cfg, dataset, plan, feed, warmup=1, steps=2)

    first = loop.once()
    probe = loop._state[0]  # the Lightning backend's probe the loop trains
    network, optimizer = probe.torch_task, probe.optimizer
    before = [p.detach().clone() for p in network.parameters()]
    second = loop.once()

    assert first.images_per_s > 0 and second.median_step_images_per_s > 0
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, network.parameters()))  # it trained
    # the lr of the run's schedule after its 2 x (1 + 2) steps, as a Lightning run would have it (warming up)
    steps_per_epoch = plan.epoch.train_steps
    assert optimizer.param_groups[0]["lr"] == pytest.approx(
        plan.effective_lr
        * lr_factor(
            6,
            steps_per_epoch=steps_per_epoch,
            epochs=plan.epochs,
            warmup_epochs=1,
            warmup_div=cfg.optim.warmup_div,
            schedule=str(cfg.optim.schedule),
        )
    )
    assert optimizer.param_groups[0]["lr"] < plan.effective_lr
    loop.close()


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_the_plain_torch_loop_runs_the_precision_lightnings_trainer_runs(precision):
    import lightning as L

    from hydrali.backends.lightning.module import precision_plugin

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    mine = precision_plugin(precision, "cpu")

    assert type(mine) is type(trainer.precision_plugin)
    assert (mine.precision, getattr(mine, "device", None)) == (
        trainer.precision_plugin.precision,
        getattr(trainer.precision_plugin, "device", None),
    )


def test_keras_own_bound_trains_the_keras_model_on_one_batch_of_the_shard(make_cfg):
    from hydra.utils import instantiate

    from hydrali.bench.keras_loops import KerasBound

    cfg = make_cfg("backend=keras", *SMALL_NET, f"data.batch_size={BATCH}")
    task = instantiate(cfg.task)
    bound = KerasBound(cfg, task, task.prepare_data(cfg.data, verify="off"), warmup=1, steps=2, device="cpu")
    before = [w.numpy().copy() for w in bound.model.trainable_variables]

    assert bound.once().images_per_s > 0
    assert any((b != w.numpy()).any() for b, w in zip(before, bound.model.trainable_variables))


def test_the_plain_keras_loop_fed_by_dali_trains_several_batches_per_call(make_cfg):
    from hydra.utils import instantiate

    from hydrali.bench.keras_loops import KerasBound

    cfg = make_cfg("backend=keras", *SMALL_NET, f"data.batch_size={BATCH}")
    task = instantiate(cfg.task)
    dataset = task.prepare_data(cfg.data, verify="off")
    loop = KerasBound(cfg, task, dataset, warmup=2, steps=4, device="cpu", feed="dali", per_call=2)
    iterations = loop.model.optimizer.iterations
    loop.once()
    assert int(iterations.numpy()) == 2 + 4, "two optimizer steps per call, over the warm-up's and the window's calls"
