"""Which per-epoch checkpoints a run keeps (keep_checkpoints), decided the same way for every backend: the newest
`keep` of those saved and the best one by the task's monitor among the epochs that have a file (with
checkpoint_every or validate_every above 1, the record's best epoch may have none); 0 keeps every file.

A backend names its files by epoch (counted from 1, as the run record counts) and calls `prune` after each
checkpoint it writes, once the epoch's row is in the record; `best_saved_epoch` names the checkpoint a run reports
as its best.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from hydrali.core.run.record import RunRecord, best_row


def best_saved_epoch(saved: Iterable[int], rows: list[dict], monitor: str, mode: str) -> int | None:
    """The best epoch by `monitor` (`mode` max or min; the earliest on a tie) among the `saved` ones, or None when
    none of them was validated."""
    kept = set(saved)
    best = best_row([row for row in rows if row["epoch"] in kept], monitor, mode)
    return None if best is None else int(best["epoch"])


def epochs_to_remove(saved: Iterable[int], rows: list[dict], keep: int, monitor: str, mode: str) -> list[int]:
    """The saved epochs whose checkpoints go: all but the newest `keep` and the best (none when `keep` is 0)."""
    ordered = sorted(set(saved))
    if keep <= 0:
        return []
    best = best_saved_epoch(ordered, rows, monitor, mode)
    return [epoch for epoch in ordered[:-keep] if epoch != best]


def prune(files: Mapping[int, Path], record: RunRecord, keep: int, monitor: str, mode: str) -> None:
    """Delete the checkpoint files (by the epoch each holds) that keep_checkpoints does not keep."""
    for epoch in epochs_to_remove(files, record.rows, keep, monitor, mode):
        Path(files[epoch]).unlink(missing_ok=True)


def drop_after(files: Mapping[int, Path], epochs: int) -> None:
    """Delete the checkpoint files (by the epoch each holds) of more than `epochs` epochs: a run resumed from an
    earlier checkpoint abandons them (they would count as the newest and could be named the best)."""
    for epoch, path in files.items():
        if epoch > epochs:
            Path(path).unlink(missing_ok=True)
