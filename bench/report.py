"""The benchmark's results: one row per measurement (its repeats, median and ratios), the table and the JSON.

A row holds every repeat's images/s; its figure is their median. Training rows timed step by step also hold each
repeat's images/s at its median step (the table's "at the median step"): a window slower than its median step
had steps that waited, as for a batch that arrived late. A row may name baselines (other rows of the same run,
by key): its ratio against each is median / the baseline's median. A section that could not run on this machine
is a row with no figures and a reason, so that an absence is always visible. A section whose figures are not
images/s alone (OWN_COLUMNS: section 8, sweep, of whole commands' wall times) has a table of its own after the main
one, its rows' cells filled by the section.
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
    "sweep": "8 sweep",
}
COLUMNS = ("section", "measurement", "device", "images/s (median)", "at the median step", "ratio vs baselines")
# sections with a table of their own, after the main one: its columns (the first three as the main table's; a row's
# cells, Row.cells, under the others)
OWN_COLUMNS = {
    "sweep": (
        "section",
        "measurement",
        "device",
        "wall s (median)",
        "jobs",
        "train s x GPUs",
        "GPUs",
        "bound s",
        "efficiency",
        "within bound",
        "best per job",
        "largest best difference",
        "speedup",
    ),
}


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
    cells: list[str] = field(default_factory=list)  # a section of OWN_COLUMNS: its cells after `device`, in order

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
        """The Markdown table of `sections`' rows (a row measured for several sections appears under each), then a
        table of its own for each of them in OWN_COLUMNS (the main one left out when it has no section)."""
        main = [section for section in sections if section not in OWN_COLUMNS]
        tables = [self._main_table(main)] if main else []
        tables += [self._own_table(section) for section in sections if section in OWN_COLUMNS]
        return "\n\n".join(tables)

    def _main_table(self, sections: list[str]) -> str:
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

    def _own_table(self, section: str) -> str:
        columns = OWN_COLUMNS[section]
        lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
        title, count = SECTION_TITLES.get(section, section), len(columns) - 3
        for row in self.rows.values():
            if row.section != section:
                continue
            cells = [f"skipped: {row.skipped}"] if row.skipped is not None else row.cells
            cells = [*cells, *["-"] * (count - len(cells))]
            lines.append("| " + " | ".join([title, row.label, row.device, *cells]) + " |")
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
