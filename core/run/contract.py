"""Builds the run contract a backend's `fit` receives (hydrali.core.contracts.run) from the composed config, once
every decision is made: the plan, pipeline.autotune's choice and the `auto` settings resolved for the device."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hydrali.core.config.schema import Optimizer, Schedule, WeightDecayOn
from hydrali.core.contracts.backend import TrainingDevice
from hydrali.core.contracts.registry import backend_spec
from hydrali.core.contracts.run import OptimizerSettings, RunContract, TaskInputs, TrainedRunSpec
from hydrali.core.errors import HydraliError
from hydrali.core.policies import auto_settings, resizing
from hydrali.core.policies.auto_settings import AUTO
from hydrali.core.run.plan import Plan
from hydrali.core.run.summary import network_name
from hydrali.core.run.weights_from_run import as_built


def optimizer_settings(optim: DictConfig) -> OptimizerSettings:
    """The optim node's optimizer and schedule settings, typed."""
    betas = tuple(float(b) for b in optim.betas)
    if len(betas) != 2:
        raise HydraliError(f"optim.betas={list(optim.betas)}: pass two numbers, e.g. [0.9, 0.999]")
    return OptimizerSettings(
        name=Optimizer.of(optim.name, "optim.name").value,
        weight_decay=float(optim.weight_decay),
        momentum=float(optim.momentum),
        nesterov=bool(optim.nesterov),
        betas=betas,
        backbone_lr_mult=float(optim.get("backbone_lr_mult", 1.0)),
        warmup_epochs=float(optim.warmup_epochs),
        warmup_div=float(optim.warmup_div),
        schedule=Schedule.of(optim.schedule, "optim.schedule").value,
        warmup_steps=_warmup_steps(optim.get("warmup_steps")),
        ema_decay=_ema_decay(optim.get("ema_decay")),
        weight_decay_on=WeightDecayOn.of(optim.get("weight_decay_on", "kernels"), "optim.weight_decay_on").value,
        flat_fraction=_flat_fraction(optim.get("flat_fraction", 0.75)),
    )


def _flat_fraction(setting) -> float:
    if not 0.0 <= float(setting) < 1.0:
        raise HydraliError(
            f"optim.flat_fraction={setting}: pass the share of the steps after warmup at the full lr, 0 or more "
            f"and below 1 (0: cosine from the first step)"
        )
    return float(setting)


def _warmup_steps(setting) -> int | None:
    if setting is not None and int(setting) < 0:
        raise HydraliError(f"optim.warmup_steps={setting}: pass null (warmup_epochs decides) or a number of steps >= 0")
    return None if setting is None else int(setting)


def _ema_decay(setting) -> float | None:
    if setting is not None and not 0.0 < float(setting) < 1.0:
        raise HydraliError(f"optim.ema_decay={setting}: pass null (no average) or a decay between 0 and 1, e.g. 0.999")
    return None if setting is None else float(setting)


def backend_settings(backend: DictConfig, *, decided: bool = True):
    """The backend node as an instance of its registered schema (what a backend reads its own settings from);
    with `decided`, only once its `auto` speed settings are resolved."""
    spec = backend_spec(str(backend.name))
    switches = ("precision", *(switch.key for switch in spec.auto_switches))  # what auto_settings.resolve decides
    undecided = [key for key in switches if str(backend.get(key, "")) == AUTO]
    if decided and undecided:
        raise ValueError(f"backend.{undecided[0]} is still auto: resolve the auto settings first")
    schema = spec.schema
    return schema(**OmegaConf.to_container(backend, resolve=True, enum_to_str=True))


def shows_progress_bar(setting) -> bool:
    """progress_bar decided: `auto` is a bar when the console is a terminal (not a file, a pipe or a sweep's
    worker)."""
    if str(setting).lower() == AUTO:
        return sys.stdout.isatty()
    return str(setting).lower() == "true"


def run_contract(cfg: DictConfig, plan: Plan, *, with_callbacks: bool = True) -> RunContract:
    """What the backend trains by, from `cfg` (its `auto` settings already resolved) and this process's plan; without
    `with_callbacks`, the user's callbacks are not instantiated (for a model trained outside fit)."""
    specs = cfg.backend.get("callbacks", {}).values() if with_callbacks else ()
    backend = backend_settings(cfg.backend)
    return RunContract(
        plan=plan,
        optim=optimizer_settings(cfg.optim),
        task_inputs=TaskInputs(pipeline=cfg.pipeline, data=cfg.data, model=cfg.model),
        image_size=int(cfg.data.image_size),
        image_dtype=str(cfg.pipeline.dtype),
        reader_checkpointing=bool(cfg.pipeline.get("checkpointing", False)),
        batches_from_memory=bool(OmegaConf.select(cfg, "pipeline.options.decode_once", default=False)),
        precision=str(getattr(backend, "precision", "32-true")),
        compile=bool(getattr(backend, "compile", False)),
        deterministic=bool(cfg.deterministic),
        monitor=str(cfg.task.monitor),
        mode=str(cfg.task.mode),
        network=network_name(cfg.model),
        start_weights=None if cfg.model.get("weights") is None else str(cfg.model.weights),
        throughput_warmup_steps=int(cfg.throughput_warmup_steps),
        checkpoint_every=int(cfg.checkpoint_every),
        keep_checkpoints=int(cfg.keep_checkpoints),
        validate_every=int(cfg.validate_every),
        progress_bar=shows_progress_bar(cfg.progress_bar),
        callbacks=tuple(instantiate(spec) for spec in specs),
        backend=backend,
        train_sizes=resizing.training_sizes(cfg.get("progressive_resizing"), plan.epochs, int(cfg.data.image_size)),
    )


def decided_settings(contract: RunContract) -> dict:
    """The contract as plain data, for run.json's `decided`: the plan's and epoch's params, the optimizer, the
    decided speed settings, the task's DALI recipe settings (autotune's choice in them) and the backend's settings."""
    plain = {
        key: getattr(contract, key)
        for key in ("image_size", "image_dtype", "reader_checkpointing", "precision", "compile", "deterministic")
    }
    return {
        **plain,
        "plan": contract.plan.params(),
        "optim": dataclasses.asdict(contract.optim),
        "pipeline": OmegaConf.to_container(contract.task_inputs.pipeline, resolve=True, enum_to_str=True),
        "backend": json.loads(json.dumps(dataclasses.asdict(contract.backend), default=str)),
        **({"train_sizes": list(contract.train_sizes)} if contract.train_sizes else {}),
    }


def trained_run_spec(cfg: DictConfig) -> TrainedRunSpec:
    """What a backend rebuilds the network of the run `cfg` configures from (its `auto` settings already
    resolved for this machine): the model node as built, untrained."""
    backend = backend_settings(cfg.backend)
    return TrainedRunSpec(
        model=as_built(cfg.model),
        image_size=int(cfg.data.image_size),
        precision=str(getattr(backend, "precision", "32-true")),
        backend=backend,
    )


def contract_on_device(cfg: DictConfig, plan: Plan, device: TrainingDevice) -> RunContract:
    """The contract a run of `cfg` will train by, its `auto` settings decided on a copy of `cfg` for `device` (the
    one its backend trains on), as the run decides them later: what pipeline.autotune's training probe and the
    benchmark's loops build their model and feed from (they run no callbacks: none is instantiated)."""
    decided = copy.deepcopy(cfg)
    auto_settings.resolve(decided, device)
    return run_contract(decided, plan, with_callbacks=False)
