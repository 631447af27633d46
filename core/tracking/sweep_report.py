"""The end of a sweep: its jobs read back from the store, a summary table printed and logged to the parent run
(with the best value and the overrides that gave it), two pictures, and the parent closed.

Logged to the parent run: metrics `sweep/jobs`, `sweep/failed`, `sweep/interrupted` (KILLED jobs: resumable),
`sweep/best`; params `best/<key>` (the best job's overrides); artifacts `sweep/summary.txt`, `sweep/summary.json`
(an MLflow table),
`sweep/metric_per_epoch.png` (the optimized metric per epoch, one line per job) and
`sweep/params_vs_metric.png` (each swept parameter against the job's value). A sweep started again in its dir
reopens its parent (hydrali.core.tracking.mlflow_runs.sweep_parent_unlocked) and closes it again: the artifacts are
replaced, the metrics get a later value, and a best setting that changed is logged as `resume<N>/best/<key>` (MLflow
keeps a param's first value).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hydrali.core.tracking import mlflow_runs as tracking
from hydrali.core.tracking import sweep

TABLE_FILE = "sweep/summary.json"  # the parent's artifact holding the jobs' table


@dataclass(frozen=True)
class JobRow:
    """One job of the sweep as its child run records it."""

    job: str
    run_id: str
    status: str
    overrides: list[str]
    value: float | None  # what it returned to the sweeper (None: failed or nothing to return)
    error: str | None


INTERRUPTED = ("KILLED",)  # MLflow's status of a run stopped by a signal (hydrali marks it so; it resumes)


@dataclass(frozen=True)
class SweepSummary:
    """What the sweep came to: its jobs, how many failed, the best job, the parent's final status."""

    rows: list[JobRow]
    metric: str
    mode: str
    best: JobRow | None
    status: str

    @property
    def failed(self) -> int:
        """The number of jobs that failed (an error, a diverged loss): neither finished nor stopped by a signal."""
        return sum(row.status not in ("FINISHED", *INTERRUPTED) for row in self.rows)

    @property
    def interrupted(self) -> int:
        """The number of jobs stopped by Ctrl+C, SIGTERM or a preemption (KILLED: resumable, not failed)."""
        return sum(row.status in INTERRUPTED for row in self.rows)


def _job_rows(client, children) -> list[JobRow]:
    rows = []
    for run in children:
        tags = run.data.tags
        value = float(tags[sweep.OBJECTIVE_TAG]) if sweep.OBJECTIVE_TAG in tags else None
        rows.append(
            JobRow(
                job=tags.get(sweep.JOB_TAG, "?"),
                run_id=run.info.run_id,
                status=run.info.status,
                overrides=sweep.job_overrides(tags),
                value=value if value is not None and math.isfinite(value) else None,
                error=tags.get(sweep.ERROR_TAG),
            )
        )
    return sorted(rows, key=lambda row: (int(row.job) if row.job.isdigit() else math.inf, row.run_id))


def summarize(client, children, status: str | None) -> SweepSummary:
    """The summary of a sweep's child runs; `status` forces the parent's (KILLED), else FINISHED, or FAILED
    when no job finished."""
    rows = _job_rows(client, children)
    tags = next((run.data.tags for run in children if sweep.OBJECTIVE_NAME_TAG in run.data.tags), {})
    metric, mode = tags.get(sweep.OBJECTIVE_NAME_TAG, "value"), tags.get(sweep.OBJECTIVE_MODE_TAG, "max")
    scored = [row for row in rows if row.value is not None and row.status == "FINISHED"]
    sign = 1 if mode == "max" else -1
    best = max(scored, key=lambda row: sign * row.value) if scored else None
    if status is None:
        status = "FINISHED" if any(row.status == "FINISHED" for row in rows) else "FAILED"
    return SweepSummary(rows=rows, metric=metric, mode=mode, best=best, status=status)


def _short(value: str) -> str:
    """An override's value as the table shows it (floats to 4 significant digits)."""
    number = _as_float(value)
    return f"{number:.4g}" if number is not None and ("." in value or "e" in value.lower()) else value


def _settings(row: JobRow, keys: list[str]) -> str:
    """The row's values of `keys` (all its overrides if no key is swept), as `key=value` words."""
    overrides = _parse_overrides(row.overrides)
    if not keys:
        return " ".join(row.overrides)
    return " ".join(f"{key}={_short(overrides[key])}" for key in keys if key in overrides)


def format_sweep_table(summary: SweepSummary) -> str:
    """The summary as the text table printed at the end of a sweep: a head line, then one line per job with
    its status, value, swept settings and error."""
    keys = swept_keys(summary.rows)
    stopped = f", {summary.interrupted} interrupted" if summary.interrupted else ""
    head = (
        f"hydrali sweep summary: {len(summary.rows)} job(s), {summary.failed} failed{stopped}; "
        f"parent run {summary.status}"
    )
    if summary.best is not None:
        head += (
            f"; best {summary.metric} {summary.best.value:.4g} ({summary.mode}), job {summary.best.job}: "
            f"{_settings(summary.best, keys) or '(no overrides)'}"
        )
    header = ("job", "status", summary.metric, "settings" if keys else "overrides", "error")
    lines = [header] + [
        (row.job, row.status, "-" if row.value is None else f"{row.value:.4g}", _settings(row, keys), row.error or "")
        for row in summary.rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    body = ["  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths)) + "  " + line[-1] for line in lines]
    rule = "-" * min(100, max(len(line.rstrip()) for line in body + [head]))
    return "\n".join([rule, head, rule, *(line.rstrip() for line in body), rule])


def _parse_overrides(overrides: list[str]) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in overrides)
    return {key.lstrip("+~"): value for key, value in (pair for pair in pairs if len(pair) == 2)}


def swept_keys(rows: list[JobRow]) -> list[str]:
    """The override keys whose value differs between jobs (the sweep's axes)."""
    values: dict[str, set[str]] = {}
    for row in rows:
        for key, value in _parse_overrides(row.overrides).items():
            values.setdefault(key, set()).add(value)
    return sorted(key for key, seen in values.items() if len(seen) > 1)


def _as_float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def plot_metric_per_epoch(histories: dict[str, list[tuple[int, float]]], metric: str, path: Path) -> None:
    """One line per job: `metric` against the epoch (counted from 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for label, points in histories.items():
        ax.plot([epoch + 1 for epoch, _ in points], [value for _, value in points], marker="o", label=label)
    ax.set(xlabel="epoch", ylabel=metric, title=f"{metric} per epoch, one line per job")
    if histories:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_params_vs_metric(rows: list[JobRow], keys: list[str], metric: str, path: Path) -> None:
    """One panel per swept key: each finished job's value of `metric` against that key's value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = keys or ["(none swept)"]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 4), dpi=100, squeeze=False)
    scored = [row for row in rows if row.value is not None]
    for ax, key in zip(axes[0], keys):
        values = [_parse_overrides(row.overrides).get(key, "") for row in scored]
        numeric = [_as_float(value) for value in values]
        if values and all(x is not None for x in numeric):
            ax.scatter(numeric, [row.value for row in scored])
            if min(numeric) > 0 and max(numeric) / min(numeric) >= 10:
                ax.set_xscale("log")
        else:
            categories = sorted(set(values))
            ax.scatter([categories.index(value) for value in values], [row.value for row in scored])
            ax.set_xticks(range(len(categories)), categories)
        ax.set(xlabel=key, ylabel=metric)
    fig.suptitle(f"{metric} of each finished job against the swept settings")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def close_sweep(store: sweep.SweepStore, status: str | None = None) -> SweepSummary | None:
    """Summarize the sweep in `store` from its child runs, print the table, log it and the pictures to the
    parent run and close the parent (`status` KILLED on Ctrl+C: its RUNNING children too). None if the sweep
    made no parent run."""
    from mlflow.tracking import MlflowClient

    tracking.quiet_mlflow_loggers()
    client = MlflowClient(tracking_uri=store.uri)
    experiment = client.get_experiment_by_name(store.experiment)
    parent = experiment and tracking.find_sweep_parent(client, experiment.experiment_id, store.sweep_dir)
    if not parent:
        return None
    children = client.search_runs(
        [experiment.experiment_id], max_results=10000, filter_string=f"tags.`mlflow.parentRunId` = '{parent}'"
    )
    if status in ("KILLED", "FAILED"):  # the sweep was stopped: so were the jobs still running
        with tracking.store_lock(store.uri):
            for run in children:
                if run.info.status == "RUNNING":
                    client.set_terminated(run.info.run_id, status)
        children = [client.get_run(run.info.run_id) for run in children]
    summary = summarize(client, children, status)
    try:
        _report(client, parent, summary)
    finally:  # whatever the report meets, the parent does not stay RUNNING
        with tracking.store_lock(store.uri):
            client.set_terminated(parent, summary.status)
    return summary


def _report(client, parent: str, summary: SweepSummary) -> None:
    """Print the table and log it, the pictures, the counts and the best job to the parent run."""
    table = format_sweep_table(summary)
    print(table, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        histories = {
            f"job {row.job}: {_settings(row, swept_keys(summary.rows))}"[:60]: [
                (m.step, m.value)
                for m in sorted(client.get_metric_history(row.run_id, summary.metric), key=lambda m: m.step)
            ]
            for row in summary.rows
        }
        plot_metric_per_epoch(
            {k: v for k, v in histories.items() if v}, summary.metric, Path(tmp) / "metric_per_epoch.png"
        )
        plot_params_vs_metric(
            summary.rows, swept_keys(summary.rows), summary.metric, Path(tmp) / "params_vs_metric.png"
        )
        for name in ("metric_per_epoch.png", "params_vs_metric.png"):
            client.log_artifact(parent, str(Path(tmp) / name), "sweep")
    client.log_text(parent, table + "\n", "sweep/summary.txt")
    _log_table(
        client,
        parent,
        {
            "job": [row.job for row in summary.rows],
            "status": [row.status for row in summary.rows],
            summary.metric: [row.value for row in summary.rows],
            "overrides": [" ".join(row.overrides) for row in summary.rows],
            "error": [row.error or "" for row in summary.rows],
            "run_id": [row.run_id for row in summary.rows],
        },
    )
    with tracking.store_lock(client.tracking_uri):
        client.log_metric(parent, "sweep/jobs", len(summary.rows))
        client.log_metric(parent, "sweep/failed", summary.failed)
        client.log_metric(parent, "sweep/interrupted", summary.interrupted)
        if summary.best is not None:
            client.log_metric(parent, "sweep/best", summary.best.value)
            client.set_tag(parent, "hydrali.best_run_id", summary.best.run_id)
            client.set_tag(parent, "hydrali.best_overrides", " ".join(summary.best.overrides))
            best = {f"best/{key}": value for key, value in _parse_overrides(summary.best.overrides).items()}
            existing = client.get_run(parent).data.params  # a parent reopened holds an earlier close's best
            prefix = tracking.resume_prefix(existing)
            for key, value in best.items():
                if existing.get(key) != value:
                    client.log_param(parent, key if key not in existing else prefix + key, value)


def _log_table(client, parent: str, data: dict) -> None:
    """The jobs' table as the parent's MLflow table TABLE_FILE; a parent reopened (the sweep started again in its
    dir) has its earlier close's table replaced, where MLflow's log_table would append to it."""
    if not any(item.path == TABLE_FILE for item in client.list_artifacts(parent, Path(TABLE_FILE).parent.as_posix())):
        client.log_table(parent, data=data, artifact_file=TABLE_FILE)
        return
    import pandas as pd

    client.log_text(parent, pd.DataFrame(data).to_json(orient="split", index=False), TABLE_FILE)  # log_table's form
