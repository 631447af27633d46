"""MLflow tracking: one run per job, params from the resolved config and the plan, metrics per epoch.

Only global rank 0 tracks; other ranks get a NullTracker. Under `-m` each job's run is a child of
one parent run per sweep directory. A resumed job continues its own run (its id is in the run dir's run.json).

Every call to a tracking server has a timeout and a bounded number of retries (tracking.timeout_s,
tracking.retries); a server that does not answer at the start is one line before anything is written, and one
that stops answering during a run ends the run's tracking with one warning, not its training: the run's own
files (history.json, summary.json) keep its record.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

from hydrali.core.errors import HydraliError, first_line

log = logging.getLogger(__name__)

_PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value's length
_METRIC_KEY_LIMIT = 250  # MLflow's limit on a metric key's length
_METRICS_PER_CALL = 1000  # MLflow's limit on the metrics of one log_batch
_SQLITE_PREFIX = "sqlite:///"
SWEEP_TAG = "hydrali.sweep_dir"  # on a sweep's parent run: the sweep dir it stands for
_EXPECTED_ON_RESUME = {"ckpt_path"}  # changes on every resume: logged, not announced
# MLflow's settings of its HTTP requests (read at every request)
HTTP_TIMEOUT, HTTP_RETRIES = "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
HTTP_BACKOFF = "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"
_BACKOFF_FACTOR = 1  # seconds: MLflow's retries wait 1, 2, 4, ... s (its default, 2, waits minutes after 7 tries)


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """Flatten nested dicts and lists into {"a.b.0": "value"} with string values."""
    out: dict[str, str] = {}
    if isinstance(tree, Mapping):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(tree))
    else:
        return {prefix: str(tree)[:_PARAM_VALUE_LIMIT]}
    for key, value in items:
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, (Mapping, list, tuple)) and len(value) > 0:
            out.update(flatten(value, name))
        else:
            out[name] = str(value)[:_PARAM_VALUE_LIMIT]
    return out


class NullTracker:
    """Tracking turned off (tracking=none, or a rank other than 0): every call does nothing."""

    run_id: str | None = None
    uri: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Do nothing."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Do nothing."""

    def log_text(self, text: str, artifact_file: str) -> None:
        """Do nothing."""

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Do nothing."""

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Do nothing."""

    def finish(self, status: str) -> None:
        """Do nothing."""


def _tolerant(write):
    """A tracker's write that, when the store fails, stops the run's tracking with one warning instead of the
    run (and does nothing once it has stopped)."""

    @functools.wraps(write)
    def guarded(self, *args, **kwargs):
        if self.stopped:
            return None
        try:
            return write(self, *args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the store's trouble must not end the training
            self.stopped = True
            kept = f"{self.output_dir}/history.json and summary.json" if self.output_dir else "the run's own files"
            log.warning(
                "tracking stopped: MLflow at %s failed (%s); training goes on and %s keep the run's record",
                self.uri,
                first_line(err),
                kept,
            )
            return None

    return guarded


class MlflowTracker(NullTracker):
    """One MLflow run, written through MlflowClient (no global fluent state). On a SQLite store every write
    holds the store's lock (`store_lock`), so that the processes of a parallel sweep never meet SQLite's
    "database is locked". The first write that fails ends the run's tracking with one warning (`stopped`);
    training goes on."""

    def __init__(self, client, run_id: str, uri: str, output_dir: Path | None = None):
        self.client = client
        self.run_id = run_id
        self.uri = uri
        self.output_dir = output_dir
        self.stopped = False  # a write failed: nothing more is sent

    @_tolerant
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params in batches (MLflow takes at most 100 per call). In a continued run, an equal value is
        kept and a changed one is logged as `resume<N>/<key>` (N counts the resumes) and shown in the log."""
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        values = {k: str(v)[:_PARAM_VALUE_LIMIT] for k, v in params.items()}
        fresh = {k: v for k, v in values.items() if k not in existing}
        changed = {k: v for k, v in values.items() if k in existing and existing[k] != v}
        if changed:
            prefix = resume_prefix(existing)
            fresh.update({prefix + k: v for k, v in changed.items()})
            shown = {k: v for k, v in changed.items() if k not in _EXPECTED_ON_RESUME}
            if shown:
                log.warning(
                    "resumed with changed settings (MLflow params %s*): %s",
                    prefix,
                    "; ".join(f"{k} {existing[k]} -> {v}" for k, v in sorted(shown.items())),
                )
        batch = [Param(k, v) for k, v in fresh.items()]
        with store_lock(self.uri):
            for i in range(0, len(batch), 100):
                self.client.log_batch(self.run_id, params=batch[i : i + 100])

    @_tolerant
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log one value per metric at `step` (the epoch index)."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        if batch:
            with store_lock(self.uri):
                self.client.log_batch(self.run_id, metrics=batch)

    @_tolerant
    def log_text(self, text: str, artifact_file: str) -> None:
        """Store `text` as an artifact file of the run."""
        self.client.log_text(self.run_id, text, artifact_file)

    @_tolerant
    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Upload a file to the run's artifacts."""
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    @_tolerant
    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags on the run (e.g. the value returned to a sweeper)."""
        with store_lock(self.uri):
            for key, value in tags.items():
                self.client.set_tag(self.run_id, key, str(value)[:_PARAM_VALUE_LIMIT])

    @_tolerant
    def finish(self, status: str) -> None:
        """End the run with FINISHED, FAILED or KILLED."""
        with store_lock(self.uri):
            self.client.set_terminated(self.run_id, status)


def resume_prefix(existing: Mapping[str, str]) -> str:
    """`resume<N>/`: the prefix under which a run continued or reopened logs a param whose value changed (MLflow
    keeps a param's first value), N one more than the latest among its params `existing`."""
    previous = [int(m.group(1)) for k in existing if (m := re.match(r"resume(\d+)/", k))]
    return f"resume{max(previous, default=0) + 1}/"


def quiet_mlflow_loggers() -> None:
    """Keep MLflow's and alembic's start-up chatter out of a run's log."""
    for name in ("alembic", "mlflow.store.db.utils", "mlflow.tracking._tracking_service.utils"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _experiment_id(client, name: str, artifact_location: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = Path(artifact_location).resolve().as_uri() if artifact_location else None
    return client.create_experiment(name, artifact_location=location)


def find_sweep_parent(client, experiment_id: str, sweep_dir: str) -> str | None:
    """The id of the running parent run of the sweep in `sweep_dir`, or None (none is open: the sweep has not
    started a job yet, or it was closed)."""
    found = client.search_runs(
        [experiment_id],
        max_results=1,
        filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_dir}' and attributes.status = 'RUNNING'",
    )
    return found[0].info.run_id if found else None


def reopen_sweep_parent(client, run_id: str) -> None:
    """Mark the sweep's parent run `run_id` RUNNING again if it was closed (KILLED by Ctrl+C, FAILED): a job of the
    sweep, started again in its dir, opens or continues its own run; the caller holds the store's lock."""
    if client.get_run(run_id).info.status != "RUNNING":
        client.update_run(run_id, status="RUNNING")
        log.info("the sweep goes on in its dir: its parent MLflow run %s is running again", run_id)


def sweep_parent_unlocked(client, experiment_id: str, sweep_dir: str) -> str:
    """The id of the parent run of the sweep in `sweep_dir`: the running one; else its latest, reopened (the same
    sweep started again in its dir, whose other sweeps are refused: hydrali.core.run.sweep_dir); else one made now
    (the caller holds the lock)."""
    found = find_sweep_parent(client, experiment_id, sweep_dir)
    if found:
        return found
    closed = client.search_runs(
        [experiment_id],
        max_results=1,
        filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_dir}'",
        order_by=["attributes.start_time DESC"],
    )
    if closed:
        reopen_sweep_parent(client, closed[0].info.run_id)
        return closed[0].info.run_id
    return client.create_run(
        experiment_id, run_name=f"sweep {Path(sweep_dir).name}", tags={SWEEP_TAG: sweep_dir}
    ).info.run_id


def sweep_parent(client, experiment_id: str, sweep_dir: str) -> str:
    """The id of the parent run of the sweep in `sweep_dir`, made by the first job that asks (under the
    store's lock, so that parallel jobs find one parent)."""
    with store_lock(client.tracking_uri):
        return sweep_parent_unlocked(client, experiment_id, sweep_dir)


def open_store(uri: str, experiment: str, artifact_location: str | None):
    """(client, experiment id) of `experiment` in the store at `uri`, the experiment made if new; one line
    naming tracking.uri if the store cannot be opened."""
    quiet_mlflow_loggers()
    from mlflow.tracking import MlflowClient

    try:
        with store_lock(uri):  # two runs starting on a fresh store would both create its tables
            client = MlflowClient(tracking_uri=uri)
            return client, _experiment_id(client, experiment, artifact_location)
    except Exception as err:  # a bad URI or an unreadable store
        raise HydraliError(
            f"cannot open the MLflow store tracking.uri={uri}: {first_line(err)}: fix tracking.uri or use tracking=none"
        ) from err


def configure_http(timeout_s: float, retries: int) -> None:
    """Bound every request MLflow sends to a tracking server in this process (and the processes it starts):
    `timeout_s` seconds each, `retries` retries."""
    os.environ[HTTP_TIMEOUT] = str(max(1, round(timeout_s)))
    os.environ[HTTP_RETRIES] = str(retries)
    os.environ[HTTP_BACKOFF] = str(_BACKOFF_FACTOR)


def check_reachable(uri: str, timeout_s: float) -> None:
    """Fail in seconds, in one line, when the store cannot be opened (a folder that cannot be made) or its
    server does not answer an HTTP request within `timeout_s` (nothing listening, or a server that accepts
    and never answers), instead of MLflow's minutes of retries."""
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        folder = Path(uri[len("sqlite:///") :]).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise HydraliError(
                f"cannot create the MLflow store's folder {folder} (tracking.uri={uri}): "
                f"{err.strerror}: set tracking.uri=sqlite:///<a writable path> or use tracking=none"
            ) from err
    elif parsed.scheme in ("http", "https"):
        import urllib.error
        import urllib.request

        silent = HydraliError(
            f"the MLflow server at tracking.uri={uri} accepted the connection but did not answer within "
            f"{timeout_s:g} s (tracking.timeout_s): check the server, or use tracking.uri=sqlite:///<path> or "
            f"tracking=none"
        )
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
        except urllib.error.HTTPError:
            return  # it answered (a server without /health answers 404)
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)  # urllib wraps what the socket said
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise silent from err
            why = getattr(reason, "strerror", None) or reason
            raise HydraliError(
                f"cannot reach the MLflow server at tracking.uri={uri} ({why}): "
                f"start the server or use tracking.uri=sqlite:///<path> or tracking=none"
            ) from err


@contextlib.contextmanager
def store_lock(uri: str):
    """Hold an exclusive lock beside a SQLite store (other stores: nothing)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    with open(uri[len("sqlite:///") :] + ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def start_tracking(
    *,
    enabled: bool,
    is_global_zero: bool,
    uri: str | None,
    experiment: str,
    artifact_location: str | None,
    output_dir: Path,
    run_name: str,
    sweep_dir: str | None,
    run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> NullTracker:
    """Open this job's MLflow run with `tags` (under -m, `sweep_dir` set, a child of the sweep's parent run), or
    continue the run `run_id` (the run dir's, on a resume). The runner has already checked the store with
    `check_reachable`."""
    if not enabled or not is_global_zero:
        return NullTracker()
    if not uri:
        raise HydraliError("tracking.uri is empty: set tracking.uri=sqlite:///path/mlflow.db or use tracking=none")
    client, experiment_id = open_store(uri, experiment, artifact_location)

    if run_id is not None:
        try:
            with store_lock(uri):
                client.update_run(run_id, status="RUNNING")
                parent = client.get_run(run_id).data.tags.get("mlflow.parentRunId")
                if sweep_dir and parent:  # a job of a sweep started again in its dir: the sweep is open again
                    reopen_sweep_parent(client, parent)
        except Exception as err:  # noqa: BLE001 - MLflow's error for a run it does not hold
            raise HydraliError(
                f"{output_dir} is tracked as MLflow run {run_id}, which tracking.uri={uri} does not hold "
                f"({first_line(err)}): resume with the run's own tracking.uri (its run.json names it)"
            ) from err
        log.info("continuing MLflow run %s", run_id)
        return MlflowTracker(client, run_id, uri, output_dir)

    tags = {"hydrali.output_dir": str(output_dir), **(tags or {})}
    if sweep_dir:
        tags["mlflow.parentRunId"] = sweep_parent(client, experiment_id, sweep_dir)
    with store_lock(uri):
        run = client.create_run(experiment_id, run_name=run_name, tags=tags)
    return MlflowTracker(client, run.info.run_id, uri, output_dir)


def metric_key(name: str) -> str:
    """`name` as an MLflow metric key: characters MLflow refuses (it takes letters, digits, _ - . space / :) as _,
    at most _METRIC_KEY_LIMIT characters."""
    return re.sub(r"[^\w\-. /:]", "_", name)[:_METRIC_KEY_LIMIT]


def log_to_finished_run(uri: str, run_id: str, metrics: Mapping[str, float], artifacts: list[tuple[Path, str]]) -> None:
    """Add `metrics` (key -> value, logged at step 0) and `artifacts` ((file, artifact folder)) to the existing
    run `run_id` of the store at `uri` (hydrali eval: the trained run's own MLflow run); its status is left alone.
    A HydraliError naming the store if it is gone (a SQLite file is never created here) or cannot be written."""
    if uri.startswith(_SQLITE_PREFIX) and not Path(uri[len(_SQLITE_PREFIX) :]).is_file():
        raise HydraliError(f"the MLflow store {uri} is gone")
    quiet_mlflow_loggers()
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    try:
        with store_lock(uri):
            client = MlflowClient(tracking_uri=uri)
            now = int(time.time() * 1000)
            batch = [Metric(metric_key(k), float(v), now, 0) for k, v in metrics.items()]
            for start in range(0, len(batch), _METRICS_PER_CALL):
                client.log_batch(run_id, metrics=batch[start : start + _METRICS_PER_CALL])
            for path, folder in artifacts:
                client.log_artifact(run_id, str(path), folder)
    except Exception as err:  # a run deleted since, a store that cannot be written
        raise HydraliError(f"MLflow run {run_id} of {uri} cannot be written: {first_line(err)}") from err
