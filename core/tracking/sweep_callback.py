"""A Hydra callback that closes a sweep's parent MLflow run, with the sweep's summary, when `-m` ends."""

from __future__ import annotations

from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

_sweep: dict = {"started": False, "store": None, "status": None}  # the sweep this process launches, where it
#   is tracked, how its parent closed


def sweep_started() -> bool:
    """Whether this process launched a sweep (its jobs may run in other processes)."""
    return _sweep["started"]


def last_sweep_status() -> str | None:
    """FINISHED, FAILED (every job failed) or None (no sweep closed here, or tracking off)."""
    return _sweep["status"]


def open_sweep_store():
    """Where the sweep this process launches is tracked, if it has not been closed yet (else None)."""
    return _sweep["store"] if _sweep["status"] is None else None


def _store(config: DictConfig):
    from hydrali.core.tracking.sweep import SweepStore

    HydraConfig.instance().set_config(config)  # so that ${hydra:...} in tracking.uri resolves
    return SweepStore.from_config(config.tracking, config.hydra.sweep.dir)


class CloseSweepRun(Callback):
    """At the end of a multirun, summarize the sweep and close its parent MLflow run (if tracking made one)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Remember where the sweep is tracked, in the process that launches its jobs (they may run in others)."""
        _sweep["started"], _sweep["store"] = True, _store(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Summarize the sweep and close its parent run (in the job's first process only, under torchrun/srun)."""
        from hydrali.core.distributed import topology

        store = _store(config)
        if store is None or not topology.is_first_process():
            return
        from hydrali.core.tracking.sweep_report import close_sweep

        summary = close_sweep(store)
        _sweep["status"] = summary.status if summary is not None else "FINISHED"
