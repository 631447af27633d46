"""What a run writes into its dir only once its checks have passed: the job's log file and Hydra's `.hydra/`.

A refused attempt (a bad checkpoint, `ckpt_path=last` in a dir without one, ...) must leave a run dir as
it found it. Hydra would write `.hydra/` and open the log file before hydrali's checks run, so the config
turns Hydra's own saving off (`hydra.output_subdir: null`) and logs through `DeferredFileHandler`; the
runner calls `accept_run` when the checks have passed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

HYDRA_SUBDIR = ".hydra"  # where Hydra keeps a run's config, its own config and the command-line overrides


class DeferredFileHandler(logging.FileHandler):
    """A log file that is opened only when the run is accepted; the records before that are held until then,
    and dropped if the run is refused."""

    def __init__(self, filename: str, mode: str = "a", encoding: str | None = None):
        super().__init__(filename, mode, encoding, delay=True)
        self.held: list[logging.LogRecord] | None = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.held is None:
            super().emit(record)
        else:
            self.held.append(record)

    def accept(self) -> None:
        """Open the file and write the records held so far."""
        held, self.held = self.held or [], None
        for record in held:
            super().emit(record)


def accept_run(cfg: DictConfig, output_dir: Path, write_config: bool = True) -> None:
    """The run passed its checks: start this process's log file and (with `write_config`, in one process of
    the run) write Hydra's record of it: config, Hydra's config, overrides."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, DeferredFileHandler):
            handler.accept()
    from hydra.core.hydra_config import HydraConfig

    if not write_config or not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    folder = Path(output_dir) / HYDRA_SUBDIR
    folder.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, folder / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": hydra_cfg}), folder / "hydra.yaml")
    OmegaConf.save(OmegaConf.create(list(hydra_cfg.overrides.task)), folder / "overrides.yaml")
