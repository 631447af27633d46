"""Configs composed as `hydrali <overrides>` would compose them, and the tiny overrides that tests train with."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from hydrali.core.config.store import register_schemas

# A narrow network on 16 x 16 images: for tests of what happens around training, not of what it learns
SMALL_NET = ["model.widths=[8,16,32]", "data.image_size=16"]
# SMALL_NET fed by the light recipe: seconds per epoch on the digits
TINY = ["pipeline=light", *SMALL_NET]
# No progress bar and no model summary on Lightning; Keras' fit without its per-epoch output
LIGHTNING_QUIET = ["progress_bar=false", "backend.trainer.enable_model_summary=false"]
KERAS_QUIET = ["progress_bar=false"]


def compose_config(overrides: list[str], root: Path, data_dir: Path, output_dir: Path | None = None) -> DictConfig:
    """The config `hydrali <overrides>` would run, with its paths under `root` (HydraConfig set, as at run time)."""
    register_schemas()
    GlobalHydra.instance().clear()
    output_dir = output_dir or root / "run"
    with initialize_config_module(config_module="hydrali.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[f"paths.root={root}", f"paths.data_dir={data_dir}", f"hydra.run.dir={output_dir}", *overrides],
            return_hydra_config=True,
        )
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        del cfg["hydra"]
    return cfg


def with_plugin_callback(key: str, name: str, **args: str) -> str:
    """The override that adds the callback tests.support.plugins.<name>(**args) to a run as backend.callbacks.<key>."""
    fields = "".join(f", {field}: '{value}'" for field, value in args.items())
    return f"+backend.callbacks.{key}={{_target_: tests.support.plugins.{name}{fields}}}"
