"""Checks across config groups that a per-group schema cannot make (run before any work)."""
from __future__ import annotations

from importlib import resources

import yaml
from omegaconf import DictConfig, OmegaConf

from hydrali.core.errors import HydraliError
from hydrali.core.pipelines import check_options

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
                names.append(entry.name[:-len(".yaml")])
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
            f"choose pipeline= one of {choices}")


def check_config(cfg: DictConfig) -> None:
    """Every cross-group check, in order; the first failure ends the run with its message."""
    check_missing(cfg)
    check_pipeline_fits_task(cfg)
    check_options(cfg.pipeline.recipe, OmegaConf.to_container(cfg.pipeline.options, resolve=True))
