"""A table of the runs under a sweep dir (or several run dirs), one row per run from its summary.json and the
overrides in run.json: best val/acc and its epoch, epochs, train seconds, images/s, the backend and the settings.
For the GPU calls of issue 53 (bench/gpu/imagenette.sh), whose sweeps try photo-folder settings side by side.

    python3 -m hydrali.bench.gpu.runs_table /tmp/nette-runs/defaults [more dirs...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def run_dirs(roots: list[str]) -> list[Path]:
    """The run dirs (those holding a summary.json or a run.json) at or right under each of `roots`."""
    found: list[Path] = []
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        candidates = [root] if (root / "run.json").exists() else sorted(root.iterdir(), key=_job_order)
        found += [path for path in candidates if (path / "run.json").exists()]
    return found


def _job_order(path: Path) -> tuple:
    """Sweep jobs by number (2 before 10), other dirs after them by name."""
    return (0, int(path.name), "") if path.name.isdigit() else (1, 0, path.name)


def row(run_dir: Path) -> str:
    """One markdown row for `run_dir`: what it reached, how fast, with which overrides (failed: what is known)."""
    overrides = json.loads((run_dir / "run.json").read_text()).get("overrides", [])
    shown = " ".join(o for o in overrides if not o.startswith(("hydra.", "paths.", "data.root=", "tracking=")))
    summary_file = run_dir / "summary.json"
    if not summary_file.exists():
        return f"| {run_dir.name} | (no summary) | | | | | {shown} |"
    summary = json.loads(summary_file.read_text())
    best = (summary.get("best") or {}).get(summary["monitor"])
    reached = "-" if best is None else f"{best:.4f} at {summary['best_epoch']}/{summary['epochs']}"
    speed = summary.get("steady_images_per_second") or summary.get("images_per_second")
    return (
        f"| {run_dir.name} | {summary['backend']} | {reached} | {summary['train_seconds']:.1f} | "
        f"{summary['wall_seconds']:.1f} | {'-' if speed is None else f'{speed:,.0f}'} | {shown} |"
    )


def main(roots: list[str]) -> None:
    """Print the table of the runs under `roots`."""
    print("| run | backend | best val/acc at epoch | train s | wall s | images/s | overrides |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for run_dir in run_dirs(roots):
        print(row(run_dir))


if __name__ == "__main__":
    main(sys.argv[1:])
