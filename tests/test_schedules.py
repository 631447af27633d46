"""The schedules fast recipes use (optim.schedule=linear, optim.warmup_steps), the same lr at every optimizer step on
both backends: each backend's own schedule object (torch's LambdaLR over its optimizer, Keras' LearningRateSchedule
asked with the batch count, as Keras asks it) against the schedule written out here."""

import dataclasses

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from hydrali.core.distributed.topology import Topology
from hydrali.core.errors import HydraliError
from hydrali.core.run.contract import optimizer_settings
from hydrali.core.run.epoch import EpochSteps
from hydrali.core.run.plan import make_plan

BASE = {
    "name": "sgd",
    "weight_decay": 0.0,
    "momentum": 0.9,
    "nesterov": True,
    "betas": [0.9, 0.999],
    "warmup_epochs": 1,
    "warmup_div": 10.0,
    "schedule": "linear",
    "warmup_steps": 3,
    "ema_decay": None,
}
EPOCHS, ACCUMULATE = 2, 2
CONTRACT = EpochSteps(
    train_samples=100, val_samples=10, num_shards=1, batch=10, last_batch="drop", accumulate=ACCUMULATE
)  # 10 batches: 5 optimizer steps an epoch, 10 in all


def expected_lrs(lr: float) -> list[float]:
    """Warm-up over 3 steps from lr / 10, then a straight line from lr at step 3 to 0 at step 10."""
    warm = [lr * (0.1 + 0.9 * step / 3) for step in range(3)]
    return warm + [lr * (1 - (step - 3) / 7) for step in range(3, 10)]


def _plan():
    topology = Topology(world_size=1, global_rank=0, local_rank=0, node_rank=0, replicas_per_node=1)
    plan = make_plan(
        topology=topology,
        batch_size=10,
        base_lr=0.2,
        ref_batch=20,
        rule="linear",
        warmup_epochs=1,
        epochs=EPOCHS,
        seed=0,
        device="cpu",
        accumulate=ACCUMULATE,
    )
    return dataclasses.replace(plan, epoch=CONTRACT)


def _torch_lrs(settings: dict) -> list[float]:
    """The lr of every optimizer step of the plan under torch's schedule (backends/torch/optim.py) for `settings`."""
    from hydrali.backends.torch.optim import make_schedule

    plan, optim = _plan(), optimizer_settings(OmegaConf.create(settings))
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=plan.effective_lr)
    schedule = make_schedule(optimizer, optim, plan, CONTRACT.optimizer_steps)
    lrs = []
    for _ in range(EPOCHS * CONTRACT.optimizer_steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


def test_linear_schedule_with_warmup_in_steps_gives_the_same_lr_at_every_step_on_both_backends():
    assert _plan().effective_lr == pytest.approx(0.2)  # batch 10 x 2 accumulated = ref_batch 20
    assert _torch_lrs(BASE) == pytest.approx(expected_lrs(0.2), abs=1e-7)


@pytest.mark.keras
def test_keras_schedule_counts_accumulated_batches_as_one_optimizer_step():
    from hydrali.backends.keras.optimizers import plan_schedule

    plan, optim = _plan(), optimizer_settings(OmegaConf.create(BASE))
    schedule = plan_schedule(plan, optim, CONTRACT)
    batches = EPOCHS * CONTRACT.train_steps  # Keras asks its schedule with the number of batches trained
    keras_lrs = [float(schedule(batch)) for batch in range(batches)]
    assert keras_lrs[::ACCUMULATE] == pytest.approx(expected_lrs(0.2), abs=1e-6)
    assert np.allclose(keras_lrs[1::ACCUMULATE], keras_lrs[::ACCUMULATE])


@pytest.mark.parametrize(
    "change,message",
    [
        ({"warmup_steps": -1}, "optim.warmup_steps=-1"),
        ({"ema_decay": 1.5}, "optim.ema_decay=1.5"),
        ({"ema_decay": 0.0}, "optim.ema_decay=0.0"),
    ],
)
def test_settings_out_of_range_are_one_line_naming_the_key(change, message):
    with pytest.raises(HydraliError, match=message.replace(".", r"\.")):
        optimizer_settings(OmegaConf.create({**BASE, **change}))


FLAT = {**BASE, "schedule": "flat_cosine", "flat_fraction": 0.5}  # 3 warm-up steps, then 7: the full lr for 3.5


def expected_flat_cosine_lrs(lr: float) -> list[float]:
    """Warm-up over 3 steps from lr / 10; then the full lr while the progress over the 7 steps after it is at most
    one half (steps 3 to 6); then cosine from lr to 0 over the other half: step s at lr (1 + cos(pi x p)) / 2, p the
    progress (s - 3) / 7 less one half, over one half."""
    warm = [lr * (0.1 + 0.9 * step / 3) for step in range(3)]
    flat = [lr] * 4  # progress 0, 1/7, 2/7, 3/7
    decay = [lr * 0.5 * (1 + np.cos(np.pi * ((step - 3) / 7 - 0.5) / 0.5)) for step in range(7, 10)]
    return warm + flat + decay


def test_flat_cosine_gives_the_same_lr_at_every_step_on_both_backends():
    assert _torch_lrs(FLAT) == pytest.approx(expected_flat_cosine_lrs(0.2), abs=1e-7)


@pytest.mark.keras
def test_keras_flat_cosine_is_torchs():
    from hydrali.backends.keras.optimizers import plan_schedule

    schedule = plan_schedule(_plan(), optimizer_settings(OmegaConf.create(FLAT)), CONTRACT)
    keras_lrs = [float(schedule(batch)) for batch in range(EPOCHS * CONTRACT.train_steps)]
    assert keras_lrs[::ACCUMULATE] == pytest.approx(expected_flat_cosine_lrs(0.2), abs=1e-6)


@pytest.mark.parametrize("fraction", [1.0, -0.1])
def test_a_flat_fraction_out_of_range_is_one_line(fraction):
    with pytest.raises(HydraliError, match=rf"optim\.flat_fraction={fraction}"):
        optimizer_settings(OmegaConf.create({**FLAT, "flat_fraction": fraction}))
