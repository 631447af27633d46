"""Preprocessing that matches pretrained weights: a model config may name, in `weights_preprocessing`, a callable
returning how its weights expect their images (image_size, mean, std, crop_fraction); with model.preprocessing=weights
those values replace data.image_size and the recipe's options before anything reads them, on every backend alike,
except where the command line set them."""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hydrali.core.errors import HydraliError
from hydrali.core.run.run_dir import set_on_command_line

log = logging.getLogger("hydrali")

# what a model's weights may say -> the config key it sets (a recipe without the option keeps its own)
TARGETS = {
    "image_size": "data.image_size",
    "mean": "pipeline.options.mean",
    "std": "pipeline.options.std",
    "crop_fraction": "pipeline.options.val_crop_fraction",
}
CHOICES = ("weights", "pipeline")  # model.preprocessing


def apply(cfg: DictConfig, overrides: list[str]) -> dict[str, Any]:
    """Set in `cfg` what the model's weights say of their preprocessing (model.preprocessing=weights), but for keys
    in `overrides` or options the recipe does not have; return what was set (key -> value), logged once."""
    source, choice = cfg.model.get("weights_preprocessing"), cfg.model.get("preprocessing", "weights")
    if choice not in CHOICES:
        raise HydraliError(f"model.preprocessing={choice}: pass weights or pipeline")
    if not source or choice != "weights":
        return {}
    from hydra.utils import get_method

    found = get_method(str(source))(cfg.model) or {}
    applied = {}
    for what, value in found.items():
        key = TARGETS[what]
        if set_on_command_line(key, overrides) or OmegaConf.select(cfg, key) is None:
            continue
        if OmegaConf.select(cfg, key) != value:
            OmegaConf.update(cfg, key, value, merge=False)
            applied[key] = value
    if applied:
        log.info(
            "preprocessing of model.name=%s's weights (model.preprocessing=weights): %s",
            cfg.model.get("name"),
            ", ".join(f"{key}={value}" for key, value in applied.items()),
        )
    return applied
