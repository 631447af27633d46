"""The `hydrali` command (also `python -m hydrali.core`): Hydra composes the config, hydrali.core.runner runs it."""
from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from hydrali.core.errors import HydraliError
from hydrali.core.schema import register_schemas

log = logging.getLogger("hydrali")
EXIT_USER_ERROR = 2      # a mistake the user can fix: the message names it
EXIT_INTERRUPTED = 130   # Ctrl+C (128 + SIGINT), as shells report it


@hydra.main(config_path="pkg://hydrali.conf", config_name="config", version_base="1.3")
def _hydra_entry(cfg: DictConfig) -> float | None:
    from hydrali.core.runner import run  # imported here so that `--help` and `--cfg` stay fast

    try:
        return run(cfg)
    except HydraliError as err:
        print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt:
        print(f"hydrali: interrupted: the run is marked KILLED; resume it with ckpt_path=last "
              f"hydra.run.dir={cfg.paths.output_dir}", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)


def main() -> None:
    """Run hydrali from the command line (the `hydrali` console script)."""
    register_schemas()
    _hydra_entry()
