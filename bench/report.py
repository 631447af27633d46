"""The benchmark's results: one row per measurement (its repeats, median and ratios), the table and the JSON.

A row holds every repeat's images/s; its figure is their median. Training rows timed step by step also hold each
repeat's images/s at its median step (the table's "at the median step"): a window slower than its median step
had steps that waited, as for a batch that arrived late. A row may name baselines (other rows of the same run,
by key): its ratio against each is median / the baseline's median. A section that could not run on this machine
is a row with no figures and a reason, so that an absence is always visible.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

SECTION_TITLES = {
    "loaders": "1 loaders",
    "cpu": "4 cpu-only",
    "lightning": "2 lightning",
    "keras": "3 keras",
    "detection": "5 detection",
    "scaling": "6 scaling",
    "small": "7 small images",
}
COLUMNS = ("section", "measurement", "device", "images/s (median)", "at the median step", "ratio vs baselines")


@dataclass
class Row:
    """One measurement of the run: `key` is unique, `baselines` are keys of other rows."""

    section: str
    key: str
    label: str
    device: str
    baselines: tuple[str, ...] = ()
    repeats: list[float] = field(default_factory=list)
    step_repeats: list[float] = field(default_factory=list)  # each repeat's images/s at its median step, where timed
    skipped: str | None = None  # why it did not run (no GPU, no TensorFlow, ...)
    notes: dict = field(default_factory=dict)  # settings worth recording (threads, batch, precision, ...)
    short: str = ""  # how ratios against this row name it (its label when empty)

    @property
    def name(self) -> str:
        """The row's short name, for the ratio column."""
        return self.short or self.label

    @property
    def median(self) -> float | None:
        """The median of the repeats' images/s (None when it did not run)."""
        return statistics.median(self.repeats) if self.repeats else None

    @property
    def median_step(self) -> float | None:
        """The median over the repeats of the images/s at each one's median step (None where not timed)."""
        return statistics.median(self.step_repeats) if self.step_repeats else None


class Report:
    """The rows of one run, in the order they were added."""

    def __init__(self):
        self.rows: dict[str, Row] = {}

    def add(self, row: Row) -> tuple[Row, bool]:
        """Add `row` and return (it, True); when its key is already there (one measurement shown in several
        sections), return (the existing row, False), noting `row`'s section in it."""
        existing = self.rows.get(row.key)
        if existing is None:
            self.rows[row.key] = row
            return row, True
        if row.section != existing.section and row.section not in existing.notes.setdefault("also_in", []):
            existing.notes["also_in"].append(row.section)
        return existing, False

    def skip(self, section: str, label: str, reason: str) -> None:
        """Record that `section` (or a part of it) did not run, and why."""
        self.add(Row(section=section, key=f"{section}/skipped/{label}", label=label, device="-", skipped=reason))

    def ratios(self, row: Row) -> dict[str, float]:
        """The row's median over each of its baselines' medians (baselines that did not run are left out)."""
        out = {}
        for key in row.baselines:
            base = self.rows.get(key)
            if base is not None and base.median and row.median is not None:
                out[base.name] = row.median / base.median
        return out

    def table(self, sections: list[str]) -> str:
        """The Markdown table of `sections`' rows (a row measured for several sections appears under each)."""
        lines = ["| " + " | ".join(COLUMNS) + " |", "| " + " | ".join("---" for _ in COLUMNS) + " |"]
        for section in sections:
            for row in self.rows.values():
                if row.section != section and section not in row.notes.get("also_in", ()):
                    continue
                title = SECTION_TITLES.get(section, section)
                if row.skipped is not None:
                    lines.append(f"| {title} | {row.label} | {row.device} | skipped: {row.skipped} | - | |")
                    continue
                ratios = ", ".join(f"{v:.2f}x {name}" for name, v in self.ratios(row).items()) or "(baseline)"
                step = f"{row.median_step:,.0f}" if row.median_step is not None else "-"
                lines.append(f"| {title} | {row.label} | {row.device} | {row.median:,.0f} | {step} | {ratios} |")
        return "\n".join(lines)

    def to_json(self, meta: dict) -> dict:
        """Everything measured, with `meta` (date, machine, versions, command, config) at the top."""
        rows = []
        for row in self.rows.values():
            rows.append(
                {
                    "section": row.section,
                    "key": row.key,
                    "measurement": row.label,
                    "device": row.device,
                    "images_per_s": row.median,
                    "repeats": row.repeats,
                    "skipped": row.skipped,
                    "median_step_images_per_s": row.median_step,
                    "step_repeats": row.step_repeats,
                    "short": row.name,
                    "ratios": self.ratios(row),
                    "baselines": list(row.baselines),
                    "notes": {k: v for k, v in row.notes.items() if k != "also_in"},
                    "sections": [row.section, *row.notes.get("also_in", ())],
                }
            )
        return {**meta, "rows": rows}

    def write_json(self, path: Path, meta: dict) -> Path:
        """Write the JSON results to `path` (its folder created); return it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(meta), indent=2) + "\n")
        return path
