"""Checks across config groups that a per-group schema cannot make (run before any work)."""

from __future__ import annotations

import dataclasses
import difflib
from importlib import resources

import yaml
from omegaconf import DictConfig, OmegaConf

from hydrali.core.config.schema import GROUP_SCHEMAS, HydraliConfig
from hydrali.core.contracts.backend import Capability
from hydrali.core.contracts.registry import backend_spec, backend_specs, replaced_keys, task_specs
from hydrali.core.data.pipelines import check_options
from hydrali.core.errors import HydraliError
from hydrali.core.policies.auto_settings import check_backend_settings
from hydrali.core.process.preemption import signal_number
from hydrali.core.run.run_dir import override_key

_HINTS = {
    "data.root": "data.root=/path/to/dataset (a folder holding train/ and val/, one sub-folder per class)",
}


def pipelines_for(task_name: str) -> list[str]:
    """The pipeline options in conf/pipeline/ that feed `task_name`."""
    names = []
    for entry in resources.files("hydrali.conf").joinpath("pipeline").iterdir():
        if entry.name.endswith(".yaml"):
            declared = yaml.safe_load(entry.read_text()) or {}
            if declared.get("task") == task_name:
                names.append(entry.name[: -len(".yaml")])
    return sorted(names)


def data_for(task_name: str) -> list[str]:
    """The data options in conf/data/ whose schema is `task_name`'s."""
    names = []
    for entry in resources.files("hydrali.conf").joinpath("data").iterdir():
        if entry.name.endswith(".yaml"):
            defaults = (yaml.safe_load(entry.read_text()) or {}).get("defaults", [])
            if f"/{task_name}_data_schema" in {d.split("@")[0] for d in defaults if isinstance(d, str)}:
                names.append(entry.name[: -len(".yaml")])
    return sorted(names)


def check_missing(cfg: DictConfig) -> None:
    """Fail, naming the key and how to set it, when a required value (???) was not given."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        key = missing[0]
        hint = _HINTS.get(key, f"{key}=<value>")
        raise HydraliError(f"{key} is required but not set: pass {hint} on the command line")


def check_pipeline_fits_task(cfg: DictConfig) -> None:
    """Fail when the chosen DALI recipe was written for another task."""
    task, fed = cfg.task.name, cfg.pipeline.task
    if fed != task:
        choices = ", ".join(pipelines_for(task)) or "(none)"
        raise HydraliError(
            f"pipeline={cfg.pipeline.name} is a {fed} recipe and cannot feed task={task}: "
            f"choose pipeline= one of {choices}"
        )


def closest_hint(key: str, choices) -> str:
    """`: did you mean <the closest choice>?`, or the list of choices when none is close; for a key that core
    refuses (replaced_keys), the key that does its job."""
    replaced = replaced_keys()
    if key in replaced:
        return f": it is now {replaced[key]} (the same key on every backend)"
    match = difflib.get_close_matches(key, list(choices), n=1)
    return f": did you mean {match[0]}?" if match else f" (its keys: {', '.join(sorted(choices))})"


def check_unknown_keys(cfg: DictConfig) -> None:
    """Fail, naming the closest real key, on a key that no schema declares (e.g. added with +data.bach_size=8).
    Open mappings (backend.trainer, backend.callbacks, pipeline.options, model) take any key."""
    top = {f.name for f in dataclasses.fields(HydraliConfig)}
    for key in cfg:
        if key not in top and key != "hydra":
            raise HydraliError(f"{key} is not a hydrali setting{closest_hint(str(key), top)}")
    task, backend = task_specs().get(str(cfg.task.get("name"))), backend_specs().get(str(cfg.backend.get("name")))
    schemas = {
        **GROUP_SCHEMAS,
        "task": task and task.task_schema,
        "data": task and task.data_schema,
        "backend": backend and backend.schema,
    }
    for group, schema in schemas.items():
        if schema is None or not isinstance(cfg.get(group), DictConfig):
            continue
        declared = {f.name for f in dataclasses.fields(schema)}
        for key in cfg[group]:
            if key not in declared and group == "data":
                _refuse_another_tasks_data(cfg, str(key))
            if key not in declared:
                raise HydraliError(
                    f"{group}.{key} is not a setting of {group}"
                    f"{closest_hint(f'{group}.{key}', [f'{group}.{d}' for d in declared])}"
                )


def _refuse_another_tasks_data(cfg: DictConfig, key: str) -> None:
    """Fail naming the task a data config is for: one whose data settings hold every key of cfg.data (`key`, not a
    setting of this task's data, among them)."""
    keys = set(cfg.data)
    for name, spec in task_specs().items():
        if name != cfg.task.name and keys <= {f.name for f in dataclasses.fields(spec.data_schema)}:
            raise HydraliError(
                f"data={cfg.data.get('name')} is a dataset of task={name}, not of task={cfg.task.name} (its data.{key} "
                f"is a setting of {name} data): choose a data= of task={cfg.task.name}: "
                f"{' | '.join(data_for(str(cfg.task.name)))}"
            )


def _package(target: str) -> str:
    """The package a `_target_` is defined in, one level above its module (hydrali.tasks.detection for
    hydrali.tasks.detection.torch_model.SSD)."""
    return target.rsplit(".", 2)[0]


def _targets(group: str, node: str | None = None) -> dict[str, str]:
    """The options of config group `group` (conf/<group>/) -> their `_target_` (in their `node`, for a file of the
    global package)."""
    found = {}
    for entry in resources.files("hydrali.conf").joinpath(group).iterdir():
        if entry.name.endswith(".yaml"):
            declared = yaml.safe_load(entry.read_text()) or {}
            target = (declared.get(node) or {} if node else declared).get("_target_")
            if isinstance(target, str):
                found[entry.name[: -len(".yaml")]] = target
    return found


def check_model_fits_task(cfg: DictConfig) -> None:
    """Fail, naming the models of the task, when the model's network is another task's: its `_target_` lies in the
    package of another task of conf/task/ (a model of a user's own package is not checked)."""
    model_target, task_target = cfg.model.get("_target_"), cfg.task.get("_target_")
    if not isinstance(model_target, str) or not isinstance(task_target, str):
        return
    here = _package(task_target)
    others = {_package(target): name for name, target in _targets("task", node="task").items()}
    if _package(model_target) == here or _package(model_target) not in others:
        return
    from hydra.core.hydra_config import HydraConfig

    chosen = HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None
    models = sorted(name for name, target in _targets("model").items() if _package(target) == here)
    raise HydraliError(
        f"model={chosen or model_target} is a {others[_package(model_target)]} network and cannot be trained by "
        f"task={cfg.task.name}: choose model= one of {', '.join(models) or '(none)'}"
    )


def check_backend_trains_task(cfg: DictConfig) -> None:
    """Fail when the task has no side on the framework the backend trains (task.sides)."""
    framework = backend_spec(str(cfg.backend.name)).framework
    if framework not in cfg.task.sides:
        raise HydraliError(
            f"backend={cfg.backend.name} trains {framework} models but task={cfg.task.name} has no "
            f"{framework} side (task.sides: {', '.join(cfg.task.sides) or 'none'}): choose backend= "
            f"one that trains {' or '.join(cfg.task.sides) or 'a side the task has'}"
        )


def check_config(cfg: DictConfig) -> None:
    """Every cross-group check, in order; the first failure ends the run with its message."""
    check_unknown_keys(cfg)
    check_missing(cfg)
    check_pipeline_fits_task(cfg)
    check_model_fits_task(cfg)
    check_backend_trains_task(cfg)
    check_backend_settings(cfg.backend)
    check_backend_supports(cfg)
    check_options(cfg.pipeline.recipe, OmegaConf.to_container(cfg.pipeline.options, resolve=True))
    if cfg.throughput_warmup_steps < 0:
        raise HydraliError(
            f"throughput_warmup_steps={cfg.throughput_warmup_steps}: it cannot be negative (0 times every step)"
        )
    if cfg.checkpoint_every < 1:
        raise HydraliError(
            f"checkpoint_every={cfg.checkpoint_every}: pass 1 or more (epochs between checkpoints; the last epoch's "
            f"is always saved)"
        )
    check_run_policies(cfg)
    if str(cfg.cpu_threads) != "auto" and not (str(cfg.cpu_threads).isdigit() and int(cfg.cpu_threads) > 0):
        raise HydraliError(f"cpu_threads={cfg.cpu_threads}: pass auto or a number of threads, at least 1")
    if cfg.optim.lr <= 0:
        raise HydraliError(f"optim.lr={cfg.optim.lr}: the learning rate must be above 0")
    check_counts(cfg)
    check_accumulation(cfg)
    check_tracking(cfg.tracking)
    check_bad_files(cfg.data)
    check_fine_tuning(cfg)
    check_preemption(cfg.preemption)


def check_run_policies(cfg: DictConfig) -> None:
    """The policies every backend applies the same way: validate_every, keep_checkpoints and progress_bar."""
    if cfg.validate_every < 1:
        raise HydraliError(
            f"validate_every={cfg.validate_every}: pass 1 or more (epochs between validations; the last epoch always "
            f"validates)"
        )
    if cfg.keep_checkpoints < 0:
        raise HydraliError(
            f"keep_checkpoints={cfg.keep_checkpoints}: pass 0 (keep all) or the number of newest checkpoints kept "
            f"besides the best"
        )
    if str(cfg.progress_bar).lower() not in PROGRESS_BAR_CHOICES:
        raise HydraliError(f"progress_bar={cfg.progress_bar}: pass auto, true or false")


PROGRESS_BAR_CHOICES = ("auto", "true", "false")


def asked_capabilities(cfg: DictConfig) -> dict[Capability, str]:
    """What `cfg` asks of its backend beyond training, each with the setting that asks it (as a user typed it)."""
    from hydrali.core.run.weights_from_run import names_a_run

    asked = {}
    start_side = OmegaConf.select(cfg, "progressive_resizing.start_side", default=None)
    if start_side is not None:
        asked[Capability.progressive_resizing] = f"progressive_resizing.start_side={start_side}"
    weights = OmegaConf.select(cfg, "model.weights", default=None)
    if weights is not None and names_a_run(weights):
        asked[Capability.start_from_run] = f"model.weights={weights}"
    return asked


def check_backend_supports(cfg: DictConfig) -> None:
    """Fail, in one line naming the setting and the backends that honour it, when `cfg` asks its backend for what
    its spec does not declare it supports (BackendSpec.supports): a backend never ignores a setting silently."""
    spec = backend_specs().get(str(cfg.backend.get("name")))
    if spec is None:
        return
    for capability, setting in asked_capabilities(cfg).items():
        if capability not in spec.supports:
            able = ", ".join(sorted(name for name, other in backend_specs().items() if capability in other.supports))
            raise HydraliError(
                f"{setting}: backend={spec.name} does not support {capability.value}: leave it off, or choose "
                f"backend= one of {able}"
            )


def check_counts(cfg: DictConfig) -> None:
    """The counts a run is planned from (batch, epochs, warmup, reference batch), before the data is checked (the
    plan, core/run/plan.py, checks them again with the dataset's counts)."""
    global_batch = cfg.data.get("global_batch")
    if global_batch is not None and global_batch < 1:
        raise HydraliError(f"data.global_batch={global_batch}: pass at least 1 (images per optimizer step), or null")
    if global_batch is None and cfg.data.batch_size < 1:
        raise HydraliError(f"data.batch_size={cfg.data.batch_size}: it must be at least 1")
    if cfg.epochs < 1:
        raise HydraliError(f"epochs={cfg.epochs}: it must be at least 1")
    if cfg.optim.get("warmup_epochs", 0) < 0:
        raise HydraliError(f"optim.warmup_epochs={cfg.optim.warmup_epochs}: it cannot be negative")
    if cfg.optim.get("ref_batch", 1) < 1:
        raise HydraliError(f"optim.ref_batch={cfg.optim.ref_batch}: it must be a positive batch size")


def check_accumulation(cfg: DictConfig) -> None:
    """optim.accumulate_grad_batches is at least 1, and no key of the backend's own does the job of a core key (its
    spec's replaced_keys: e.g. a framework's own gradient accumulation would train more images per step than the
    plan's lr counts, its own validation cadence would differ from validate_every's)."""
    accumulate = cfg.optim.get("accumulate_grad_batches", 1)
    if accumulate < 1:
        raise HydraliError(f"optim.accumulate_grad_batches={accumulate}: pass 1 or more (1: a step after every batch)")
    spec = backend_specs().get(str(cfg.backend.get("name")))
    for key, core in (spec.replaced_keys if spec is not None else {}).items():
        value = OmegaConf.select(cfg.backend, key, throw_on_missing=False)
        if value is not None:
            raise HydraliError(
                f"backend.{key}={_typed(value)}: pass {core}={_typed(value)} instead (the same key on every backend, "
                f"decided in core)"
            )


def _typed(value) -> str:
    """A value as a user types it on the command line (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_batch_keys(cfg: DictConfig, overrides: list[str]) -> None:
    """data.batch_size given on the command line is refused where the config fixes data.global_batch (which then
    decides each replica's batch): the user's batch would not be used."""
    fixed = cfg.data.get("global_batch")
    given = {override_key(override) for override in overrides}
    if fixed is not None and "data.batch_size" in given:
        raise HydraliError(
            f"data.batch_size={cfg.data.batch_size} would not be used: data.global_batch={fixed} fixes the images of "
            f"an optimizer step (each replica takes its share): pass data.global_batch=<images per step>, or "
            f"data.global_batch=null to take data.batch_size per replica"
        )


def check_preemption(preemption: DictConfig) -> None:
    """preemption.signals are signals a run can save on; the processes agree at least every step."""
    for name in preemption.signals:
        signal_number(str(name))
    if preemption.check_every_n_steps < 1:
        raise HydraliError(
            f"preemption.check_every_n_steps={preemption.check_every_n_steps}: pass 1 or more (1: every step)"
        )


FREEZE_CHOICES = (None, "backbone")  # model.freeze (conf/model_common.yaml)


def check_fine_tuning(cfg: DictConfig) -> None:
    """model.freeze is one of its choices, optim.backbone_lr_mult is not negative, and the task's sides can tell its
    network's backbone from its head (its TaskSpec says so) where these or model.weights ask them to."""
    mult, freeze = cfg.optim.get("backbone_lr_mult", 1.0), cfg.model.get("freeze")
    if mult < 0:
        raise HydraliError(f"optim.backbone_lr_mult={mult}: pass 0 or more (1: the head's lr)")
    if freeze not in FREEZE_CHOICES:
        raise HydraliError(f"model.freeze={freeze}: pass null (every layer trains) or backbone (only the head trains)")
    spec = task_specs().get(str(cfg.task.get("name")))
    weights = cfg.model.get("weights")
    asked = (
        [f"optim.backbone_lr_mult={mult}"] * (mult != 1.0)
        + [f"model.freeze={freeze}"] * (freeze is not None)
        + [f"model.weights={weights}"] * (weights is not None)
    )
    if asked and spec is not None and not spec.fine_tunes:
        raise HydraliError(
            f"{asked[0]} is not there yet for task={spec.name}: its network's backbone and head are not told apart"
        )


def check_bad_files(data: DictConfig) -> None:
    """data.bad_files=skip needs the check that finds them (data.verify quick or full)."""
    if str(data.get("bad_files", "fail")) == "skip" and str(data.get("verify", "quick")) == "off":
        raise HydraliError(
            "data.bad_files=skip with data.verify=off: nothing finds the files to skip; pass data.verify=quick "
            "(or full, which also finds JPEG files damaged in their middle)"
        )


def check_tracking(tracking: DictConfig) -> None:
    """A tracking server's timeout is positive and its retries are not negative."""
    if tracking.get("timeout_s", 1) <= 0:
        raise HydraliError(f"tracking.timeout_s={tracking.timeout_s}: pass a number of seconds above 0 (e.g. 10)")
    if tracking.get("retries", 0) < 0:
        raise HydraliError(f"tracking.retries={tracking.retries}: pass 0 or more")
