"""A finished run started again: the same command in its dir says so and ends with exit 0, changing nothing.

A run is finished when its dir holds its summary.json and that summary counts every epoch its recorded config
(run.json) asks for. The same command is the recorded config again, ckpt_path aside: without ckpt_path (what a
requeued job or a sweep started again in its dir runs), or with ckpt_path=last. Another config is refused as before
(core/run/run_dir.py), `ckpt_path=last epochs=<more>` trains on, and a checkpoint file named by path is judged as
ever (core/run/checkpoints.py). Nothing is written: no file in the run dir, nothing in MLflow.
"""

from __future__ import annotations

import json
from pathlib import Path

from hydrali.core.run.run_dir import Attempt, differences, not_compared, resolved
from hydrali.core.run.summary import SUMMARY_FILE

SAME_COMMAND_CKPT_PATHS = (None, "last")  # the ckpt_path values that ask again for the run as it is


def finished_summary(attempt: Attempt) -> dict | None:
    """The summary of the finished run that `attempt` asks for again, or None when there is something to do (a new
    dir, an unfinished run, another config, a checkpoint named by path, a summary missing or unreadable)."""
    cfg, run_file = attempt.cfg, attempt.run_file
    if run_file is None or cfg.ckpt_path not in SAME_COMMAND_CKPT_PATHS:
        return None
    summary = _readable_summary(Path(cfg.paths.output_dir))
    if summary is None or int(summary.get("epochs", 0)) < int(cfg.epochs):
        return None
    if differences(run_file.config, resolved(cfg), ignored=not_compared()):
        return None
    return summary


def finished_lines(summary: dict, output_dir: Path) -> list[str]:
    """What the command prints for a finished run: that it is finished and where its summary is, then the
    summary's headline (best value, epochs, MLflow run)."""
    epochs, monitor = summary["epochs"], summary["monitor"]
    best = summary["best"].get(monitor)
    best_text = f"{best:.4f} at epoch {summary['best_epoch']} of {epochs}" if best is not None else "not recorded"
    run_id = summary.get("mlflow_run_id")
    tracked = f"MLflow run {run_id}" if run_id else "tracking off"
    return [
        f"hydrali: {output_dir} holds this run, finished: nothing to train (its summary: {output_dir / SUMMARY_FILE};"
        f" ckpt_path=last epochs=<more than {epochs}> trains on)",
        f"hydrali: best {monitor} {best_text}; {tracked}",
    ]


def _readable_summary(output_dir: Path) -> dict | None:
    """The summary.json in `output_dir`, or None when there is none or it cannot be read."""
    try:
        return json.loads((output_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
