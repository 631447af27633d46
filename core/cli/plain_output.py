"""Output fit for a file: what a library colours for a terminal is written plain where the output is not one.

Optuna's default handler colours its lines (colorlog) whether or not stderr is a terminal, so a sweep's log file or a
scheduler's output held escape codes. Where stderr is not a terminal, an Optuna search's lines are written by a plain
handler instead: the same lines and format on stderr, without colour."""

from __future__ import annotations

import logging
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

OPTUNA_FORMAT = "[%(levelname)1.1s %(asctime)s] %(message)s"  # optuna.logging's default, without colorlog's codes


def plain_optuna_lines(config: DictConfig) -> bool:
    """Write Optuna's lines uncoloured when the sweep `config` is an Optuna search and stderr is not a terminal;
    whether it did."""
    sweeper = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    if "optuna" not in sweeper.lower() or sys.stderr.isatty():
        return False
    import optuna

    optuna.logging.disable_default_handler()  # colorlog's, on stderr
    plain = logging.StreamHandler()  # on stderr as Optuna's own, in its format less the colour; not propagated to the
    plain.setFormatter(logging.Formatter(OPTUNA_FORMAT))  # root logger, whose file handler is the last job's log
    logging.getLogger("optuna").addHandler(plain)
    return True


class PlainOptunaLines(Callback):
    """Under -m: an Optuna search's lines uncoloured where stderr is not a terminal (plain_optuna_lines)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Before the sweeper creates its study (its first line)."""
        plain_optuna_lines(config)
