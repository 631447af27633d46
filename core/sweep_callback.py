"""A Hydra callback that closes a sweep's parent MLflow run, with the sweep's summary, when `-m` ends."""
from __future__ import annotations

from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig


_closed: dict[str, str] = {}   # the status the last sweep of this process closed its parent with


def last_sweep_status() -> str | None:
    """FINISHED, FAILED (every job failed) or None (no sweep closed here, or tracking off)."""
    return _closed.get("status")


class CloseSweepRun(Callback):
    """At the end of a multirun, summarize the sweep and close its parent MLflow run (if tracking made one)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)  # so that ${hydra:...} in tracking.uri resolves
        if not config.tracking.enabled:
            return
        from hydrali.core.sweep import SweepStore
        from hydrali.core.sweep_report import close_sweep

        location = config.tracking.artifact_location
        summary = close_sweep(SweepStore(uri=str(config.tracking.uri), experiment=str(config.tracking.experiment),
                               sweep_dir=str(config.hydra.sweep.dir),
                               artifact_location=str(location) if location else None))
        if summary is not None:
            _closed["status"] = summary.status
