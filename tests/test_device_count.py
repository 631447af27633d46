"""backend.devices: one key and one rule on both backends, so that one command line trains on the same number of
GPUs, with the same global batch and learning rate, whichever backend it names."""

import pytest

from hydrali.core.distributed.device_count import devices_per_node, devices_setting, slurm_devices
from hydrali.core.errors import HydraliError


def test_auto_is_every_visible_gpu_or_one_without_a_gpu():
    assert [devices_per_node("auto", gpus) for gpus in (0, 1, 2, 8)] == [1, 1, 2, 8]


def test_a_count_is_taken_as_given_and_cannot_exceed_the_visible_gpus():
    assert devices_per_node(4, 8) == 4 and devices_per_node(2, 0) == 2  # on a CPU: 2 replicas
    with pytest.raises(HydraliError, match=r"backend.devices=4 but this machine shows 2 GPU\(s\)"):
        devices_per_node(4, 2)
    assert devices_per_node(8, 1, launched_externally=True) == 8  # srun's task sees its own GPU only


@pytest.mark.parametrize("bad", [0, -1, "two", 1.5, True])
def test_anything_but_a_count_or_auto_is_refused_naming_the_key(bad):
    with pytest.raises(HydraliError, match="backend.devices="):
        devices_setting(bad)


def test_slurm_needs_a_count():
    assert slurm_devices(8) == 8
    with pytest.raises(HydraliError, match="hydra/launcher=slurm needs backend.devices"):
        slurm_devices("auto")


@pytest.mark.keras
@pytest.mark.parametrize("devices,gpus", [("auto", 4), ("3", 0)])  # every GPU of a machine; CPU replicas
def test_one_command_line_plans_the_same_job_on_both_backends(make_cfg, monkeypatch, devices, gpus):
    """The plan (replicas, global batch, lr) that `backend.devices=<devices>` gives on a machine where both
    frameworks see `gpus` GPUs (faked: this machine has none) is the same on Lightning and Keras."""
    import torch
    from hydra.utils import instantiate

    from hydrali.backends.keras import backend as keras_backend
    from hydrali.core.contracts.registry import load_backend
    from hydrali.core.run.contract import backend_settings
    from hydrali.core.run.runner import build_plan

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(keras_backend, "visible_gpus", lambda: gpus)
    plans = {}
    for name in ("lightning", "keras"):
        cfg = make_cfg(f"backend={name}", f"backend.devices={devices}", "pipeline.device=cpu")
        task = instantiate(cfg.task)
        dataset = task.prepare_data(cfg.data, verify="off")
        backend = load_backend(name)
        plan = build_plan(cfg, backend, dataset, seed=0)
        plans[name] = (plan.world_size, plan.global_batch, plan.effective_lr, plan.num_shards)
        if name == "lightning":
            processes = backend.processes_to_start(backend_settings(cfg.backend, decided=False))
            assert processes == plan.world_size, "DDP, one process per device, without backend.strategy=ddp"
    expected = max(1, gpus) if devices == "auto" else int(devices)
    assert plans["lightning"] == plans["keras"]
    assert plans["keras"][0] == plans["keras"][3] == expected
    assert plans["keras"][1] == expected * cfg.data.batch_size
