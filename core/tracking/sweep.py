"""Sweeps (-m) that survive their jobs: a failed job becomes a FAILED child run and no value for the sweeper, and
the parent run is always closed (FINISHED, FAILED when every job failed, KILLED on Ctrl+C) with the sweep's
summary: a table printed and logged, and two pictures (see hydrali.core.tracking.sweep_report).

Every child run carries the tags below, so that the summary is read from the store alone, whichever launcher
(in-process, joblib's worker processes, SLURM) ran the jobs.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from hydrali.core.distributed import topology
from hydrali.core.errors import HydraliError, SweepRefused, first_line
from hydrali.core.process import job_context
from hydrali.core.run import run_dir

log = logging.getLogger("hydrali")

FAILED_VALUE = None  # what a failed job returns to the sweeper: Optuna records a trial with no value
#   as FAILED (a NaN would end hydra-optuna-sweeper's whole search)
JOB_TAG = "hydrali.job"  # the job's number in the sweep (hydra.job.num)
OVERRIDES_TAG = "hydrali.overrides"  # the job's command-line overrides, a JSON list
ERROR_TAG = "hydrali.error"  # a failed job's one-line message (its traceback: artifact error/traceback.txt)
OBJECTIVE_TAG = "hydrali.objective"  # the value the job returned to the sweeper
OBJECTIVE_NAME_TAG = "hydrali.objective_name"  # optimized_metric
OBJECTIVE_MODE_TAG = "hydrali.objective_mode"  # max | min: which way is better
_failed = {"jobs": 0}  # the jobs that failed in this process


@dataclass(frozen=True)
class SweepStore:
    """Where a sweep's runs are tracked: the MLflow store, the experiment and the sweep dir (the parent's key)."""

    uri: str
    experiment: str
    sweep_dir: str
    artifact_location: str | None = None

    @classmethod
    def from_config(cls, tracking_cfg, sweep_dir: str) -> "SweepStore | None":
        """The store that `tracking_cfg` (the tracking group) names for the sweep in `sweep_dir`; None when off."""
        if not tracking_cfg.enabled or not tracking_cfg.uri:
            return None
        location = tracking_cfg.artifact_location
        return cls(
            str(tracking_cfg.uri), str(tracking_cfg.experiment), str(sweep_dir), str(location) if location else None
        )


def current_job() -> tuple[str, list[str]] | None:
    """(job number, overrides) of the running job of a sweep; None outside -m."""
    job = job_context.current()
    return (job.num, job.overrides) if job.in_sweep else None


def job_tags() -> dict[str, str]:
    """The tags that make a child run readable by the sweep's summary (empty outside -m)."""
    job = current_job()
    if job is None:
        return {}
    num, overrides = job
    return {JOB_TAG: num, OVERRIDES_TAG: json.dumps(overrides)}


def job_overrides(tags: dict) -> list[str]:
    """The overrides a child run's tags hold (an empty list if none)."""
    try:
        return list(json.loads(tags.get(OVERRIDES_TAG, "[]")))
    except ValueError:
        return []


def sweep_store(cfg) -> SweepStore | None:
    """The store of the running sweep, if this job is part of one and tracking is on."""
    job = job_context.current()
    return SweepStore.from_config(cfg.tracking, job.sweep_dir) if job.in_sweep else None


def failure_line(err: BaseException) -> str:
    """A failure as one line: hydrali's own message, or the exception's type and first line."""
    if isinstance(err, HydraliError):
        return str(err)
    return f"{type(err).__name__}: {first_line(err)}" if str(err).strip() else type(err).__name__


def run_job(cfg, run) -> float | None:
    """Run one job of a sweep with `run(cfg)`. A failure does not end the sweep: it is printed in one line,
    recorded as a FAILED child run (message and traceback), and None is returned to the sweeper (a failed
    trial for Optuna). Only a setting no job can run with (SweepRefused) ends the sweep."""
    try:
        value = run(cfg)
    except SweepRefused:
        raise
    except Exception as err:  # noqa: BLE001 - every failure of a job is the sweep's to record, not to die of
        message = failure_line(err)
        num = current_job()[0]
        _failed["jobs"] += 1
        print(f"hydrali: job {num} failed: {message}", file=sys.stderr, flush=True)
        trace = traceback.format_exc()
        try:
            store = sweep_store(cfg) if topology.is_first_process() else None
            if store is not None:
                record_failed_job(store, Path(cfg.paths.output_dir), message, trace)
        except Exception as record_err:  # noqa: BLE001 - the store's own trouble must not end the sweep either
            log.warning("job %s: its failure could not be recorded in MLflow: %s", num, failure_line(record_err))
        return FAILED_VALUE
    if value is not None and not math.isfinite(value):
        log.warning(
            "job %s returned %s for %s: the sweeper counts it as failed", current_job()[0], value, cfg.optimized_metric
        )
        return FAILED_VALUE
    return value


def failed_here() -> int:
    """How many jobs run in this process failed (with those its worker processes counted: add_failed_elsewhere)."""
    return _failed["jobs"]


def add_failed_elsewhere(count: int) -> None:
    """Count `count` jobs that failed in a worker process of this sweep (a parallel launcher's) as failed here."""
    _failed["jobs"] += count


def record_failed_job(store: SweepStore, output_dir: Path, message: str, trace: str) -> None:
    """Mark the failed job's child run FAILED with its message (tag) and traceback (artifact); a job that failed
    before its run was opened (a refused setting) gets a FAILED child run of its own, holding its overrides."""
    from hydrali.core.tracking import mlflow_runs as tracking

    client, experiment_id = tracking.open_store(store.uri, store.experiment, store.artifact_location)
    record = run_dir.read(output_dir) if Path(output_dir).is_dir() else None
    with tracking.store_lock(store.uri):
        if record is not None and record.mlflow_run_id:
            run_id = record.mlflow_run_id
        else:
            parent = tracking.sweep_parent_unlocked(client, experiment_id, store.sweep_dir)
            tags = {**job_tags(), "mlflow.parentRunId": parent, "hydrali.output_dir": str(output_dir)}
            run_id = client.create_run(experiment_id, run_name=f"failed {output_dir.name}", tags=tags).info.run_id
            pairs = (override.split("=", 1) for override in job_overrides(tags))
            for key, value in (pair for pair in pairs if len(pair) == 2):
                client.log_param(run_id, key.lstrip("+~"), value)
        client.set_tag(run_id, ERROR_TAG, message[:5000])
        client.set_terminated(run_id, "FAILED")
    client.log_text(run_id, trace, "error/traceback.txt")
