"""The benchmark's training measurements on this machine's CPU (hydrali-bench's training sections need a GPU;
these are the parts of them that do not): a timed run through hydrali itself on both backends, which trains
its warm-up and timed steps, then stops, and gives the timed window's images/s; the plain torch loop from
either feed; Keras' own bound."""
from __future__ import annotations

import json

import pytest
import torch

from hydrali.core.bench.sections import plain
from hydrali.core.bench.training import HydraliTraining
from hydrali.core.errors import HydraliError
from tests.conftest import SMALL_NET

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
    if backend == "lightning":   # steps timed one by one (the host's clock on the CPU)
        assert first.median_step_images_per_s > 0 and second.median_step_images_per_s > 0
    for repeat in (1, 2):   # each repeat is a run of its own, stopped within its first epoch after 2 + 3 steps
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

    from hydrali.core.bench.loaders import one_replica_plan
    from hydrali.core.bench.torch_loops import TorchLoop

    cfg = make_cfg(*SMALL_NET, f"data.batch_size={BATCH}", "pipeline.device=cpu")
    task = instantiate(cfg.task)
    dataset = task.prepare_data(cfg.data, verify="off")
    loop = TorchLoop(task, cfg, dataset, one_replica_plan(cfg, dataset, "cpu"), feed, warmup=1, steps=2)

    first = loop.once()
    network = loop._state[0]
    before = [p.detach().clone() for p in network.parameters()]
    second = loop.once()

    assert first.images_per_s > 0 and second.median_step_images_per_s > 0
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, network.parameters()))   # it trained
    loop.close()


def test_keras_own_bound_trains_the_keras_model_on_tensors(make_cfg):
    from hydra.utils import instantiate

    from hydrali.core.bench.keras_loops import KerasBound

    cfg = make_cfg("backend=keras", *SMALL_NET, f"data.batch_size={BATCH}")
    task = instantiate(cfg.task)
    bound = KerasBound(cfg, task, task.prepare_data(cfg.data, verify="off"), warmup=1, steps=2)
    before = [w.numpy().copy() for w in bound.model.trainable_variables]

    assert bound.once().images_per_s > 0
    assert any((b != w.numpy()).any() for b, w in zip(before, bound.model.trainable_variables))
