"""A Hydra callback that closes a sweep's parent MLflow run when `-m` ends."""
from __future__ import annotations

from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class CloseSweepRun(Callback):
    """At the end of a multirun, mark the sweep's parent MLflow run FINISHED (if tracking made one)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)  # so that ${hydra:...} in tracking.uri resolves
        if not config.tracking.enabled:
            return
        from hydrali.core.tracking import close_sweep_parent
        close_sweep_parent(uri=config.tracking.uri, experiment=config.tracking.experiment,
                           sweep_dir=str(config.hydra.sweep.dir))
