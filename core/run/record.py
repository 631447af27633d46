"""The run record: one row of metrics per epoch, kept with the run and reloaded when it resumes.

Both backends hand each finished epoch to the same `RunRecord`; it is the only source of the
history, the best and final values, the value returned to a sweeper and the checkpoint to keep.
It lives in the run's output dir, so an interrupted run keeps its whole record: resuming at epoch k keeps rows
1..k-1 and replaces what follows.

Epochs are counted from 1 wherever a user sees them: the log, the rows' `epoch`, summary.json's `best_epoch` and
`first_epoch`, MLflow's steps, the checkpoint names of both backends (epoch003 holds the weights after the third
epoch) and detection's pictures.

Row keys (the same on every backend): epoch (counted from 1), train/loss, train/images (images trained on
in the epoch, all replicas), lr/first and lr/last (the lr of the epoch's first and last optimizer
step), and, only in epochs that validated, val/loss, val/<task metrics>, val/images (images scored).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from hydrali.core.errors import HydraliError
from hydrali.core.files import write_atomically

log = logging.getLogger("hydrali")

HISTORY_FILE = "history.json"


def best_row(rows: list[dict], metric: str, mode: str) -> dict | None:
    """The row with the best value of `metric` (max or min; the earliest on a tie), or None if never logged."""
    scored = [row for row in rows if metric in row and not math.isnan(row[metric])]
    if not scored:
        return None
    sign = 1 if mode == "max" else -1
    return max(scored, key=lambda row: (sign * row[metric], -row["epoch"]))


LINE_GROUPS = ("train", "val", "lr")  # the order of an epoch line's metrics (then by name), the same on every backend


def epoch_line(row: dict, epochs: int | None = None) -> str:
    """One epoch's row as a line a user reads, epochs counted from 1: `epoch 3/10: train/loss 0.41, val/acc 0.9`."""
    rank = {group: i for i, group in enumerate(LINE_GROUPS)}
    keys = sorted(
        (key for key in row if key != "epoch" and not key.endswith("/images") and key != "lr/first"),
        key=lambda key: (rank.get(key.split("/")[0], len(rank)), key),
    )
    shown = ", ".join(f"{key} {row[key]:.4g}" for key in keys)
    return f"epoch {row['epoch']}{f'/{epochs}' if epochs else ''}: {shown}"


class TrainingDiverged(HydraliError):
    """The training loss became NaN or infinite: the run stops (a sweep counts it as a failed job)."""


def check_finite_loss(row: dict) -> None:
    """Raise TrainingDiverged when the epoch's training loss is NaN or infinite (checked on every backend,
    at the end of the epoch in which it happened)."""
    loss = row.get("train/loss")
    if loss is not None and not math.isfinite(loss):
        raise TrainingDiverged(
            f"train/loss became {loss} in epoch {row['epoch']}: training diverged; "
            f"lower optim.lr (or raise optim.warmup_epochs) and run again"
        )


class RunRecord:
    """The per-epoch history of a run, saved after every epoch by the tracking process."""

    def __init__(
        self, output_dir: Path, tracker, rows: list[dict] | None = None, writer: bool = True, epochs: int | None = None
    ):
        self.path = Path(output_dir) / HISTORY_FILE
        self.tracker = tracker
        self.rows: list[dict] = list(rows or [])
        self.writer = writer  # only global rank 0 writes the file and logs
        self.epochs = epochs  # the run's planned number of epochs (for the log line)

    @classmethod
    def open(
        cls, output_dir: Path, tracker, resume: bool, writer: bool = True, epochs: int | None = None
    ) -> "RunRecord":
        """The record of the run in `output_dir`: reloaded when resuming, otherwise empty."""
        path = Path(output_dir) / HISTORY_FILE
        rows = json.loads(path.read_text())["history"] if resume and path.exists() else []
        if rows:
            log.info("run record: %d epoch(s) kept from before the interruption", len(rows))
        return cls(output_dir, tracker, rows, writer, epochs)

    def start(self, first_epoch: int) -> None:
        """Training (re)starts at epoch `first_epoch` (counted from 1): forget rows of that epoch and later."""
        self.rows = [row for row in self.rows if row["epoch"] < first_epoch]

    def add(self, epoch: int, metrics: dict) -> dict:
        """Record epoch `epoch`'s metrics (counted from 1), save the record, log them to the tracker (step = epoch)
        and print them as one line (the same line on every backend, with or without a progress bar)."""
        row = {"epoch": epoch, **{k: float(v) for k, v in metrics.items()}}
        self.rows = [r for r in self.rows if r["epoch"] < epoch] + [row]
        if self.writer:
            self._save()
            self.tracker.log_metrics({k: v for k, v in row.items() if k != "epoch"}, step=epoch)
            log.info("%s", epoch_line(row, self.epochs))
        check_finite_loss(row)
        return row

    def best(self, metric: str, mode: str) -> dict | None:
        """The row of the best epoch by `metric`."""
        return best_row(self.rows, metric, mode)

    def final(self, metric: str) -> float | None:
        """The last recorded value of `metric` (from the last epoch that has it)."""
        values = [row[metric] for row in self.rows if metric in row]
        return values[-1] if values else None

    def _save(self) -> None:
        write_atomically(self.path, (json.dumps({"history": self.rows}, indent=1) + "\n").encode())
