"""The `hydrali` command (also `python -m hydrali.core`): Hydra composes the config, hydrali.core.runner runs it."""
from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from hydrali.core.errors import HydraliError
from hydrali.core.schema import register_schemas

log = logging.getLogger("hydrali")


@hydra.main(config_path="pkg://hydrali.conf", config_name="config", version_base="1.3")
def _hydra_entry(cfg: DictConfig) -> float | None:
    from hydrali.core.runner import run  # imported here so that `--help` and `--cfg` stay fast

    try:
        return run(cfg)
    except HydraliError as err:
        print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)


def main() -> None:
    """Run hydrali from the command line (the `hydrali` console script)."""
    register_schemas()
    _hydra_entry()
