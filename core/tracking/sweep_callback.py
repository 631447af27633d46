"""A Hydra callback that claims a sweep's dir when `-m` starts (hydrali.core.run.sweep_dir) and closes its parent MLflow
run, with the sweep's summary, when it ends."""

from __future__ import annotations

import sys
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from hydrali.core.errors import EXIT_USER_ERROR, HydraliError

_sweep: dict = {"started": False, "store": None, "status": None, "failed": 0}  # the sweep this process launches,
#   where it is tracked, how its parent closed, how many of its jobs failed


def sweep_started() -> bool:
    """Whether this process launched a sweep (its jobs may run in other processes)."""
    return _sweep["started"]


def failed_jobs() -> int:
    """How many jobs of the sweep that ended in this process failed: as its parent run counts them, or (tracking
    off) those run in this process."""
    return _sweep["failed"]


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
        """Claim the sweep's dir (hydrali.core.run.sweep_dir) and remember where the sweep is tracked, in the
        process that launches its jobs (they may run in others)."""
        from hydrali.core.distributed import topology
        from hydrali.core.run.sweep_dir import claim_sweep_dir

        try:  # under torchrun or srun every rank runs the sweep: the first claims, the others follow its run dirs
            if topology.is_first_process():
                claim_sweep_dir(config)  # the sweep's own dir, or refused before anything is written
        except HydraliError as err:  # Hydra turns a callback's exception into a warning: the sweep ends here
            print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_USER_ERROR) from err
        _sweep["started"], _sweep["store"] = True, _store(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Summarize the sweep and close its parent run (in the job's first process only, under torchrun/srun)."""
        from hydrali.core.distributed import topology
        from hydrali.core.tracking.sweep import failed_here

        store = _store(config)
        _sweep["failed"] = failed_here()
        if store is None or not topology.is_first_process():
            return
        from hydrali.core.tracking.sweep_report import close_sweep

        summary = close_sweep(store)
        _sweep["status"] = summary.status if summary is not None else "FINISHED"
        if summary is not None:
            _sweep["failed"] = summary.failed
