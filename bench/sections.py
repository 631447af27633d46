"""The benchmark's run: its sections in order, each measuring its rows against its baselines (issue 11).

A section family owns its module: loader_sections.py (1 loaders, 4 cpu), training_sections.py (2 lightning,
3 keras, 5 detection), scaling_section.py (6 scaling), small_section.py (7 small), sweep_section.py (8 sweep);
section_base.py holds what they share (the configs, composed and checked as a run does, and the skip rules: rows
that need what the machine lacks, a GPU or TensorFlow, are recorded as skipped, with the reason, never left out).
`Bench` and `detect_machine` are what the command line (bench/cli.py) needs.
"""

from __future__ import annotations

from hydrali.bench.loader_sections import LoaderSections
from hydrali.bench.machine import detect_machine
from hydrali.bench.report import Report
from hydrali.bench.scaling_section import ScalingSection
from hydrali.bench.small_section import SmallSection
from hydrali.bench.sweep_section import SweepSection
from hydrali.bench.training_sections import TrainingSections
from hydrali.core.errors import HydraliError

__all__ = ["Bench", "detect_machine"]

LOADER_SECTIONS = ("loaders", "cpu")  # measured together: they share their baselines
# the other sections, in the order they run (each a method of Bench's, by its name)
ONE_BY_ONE = ("lightning", "keras", "detection", "scaling", "small", "sweep")
TIMED_TRAINING = ("train", "small")  # the bench nodes of training runs timed after a warm-up


class Bench(LoaderSections, TrainingSections, ScalingSection, SmallSection, SweepSection):
    """One benchmark run: `bench` is the config's bench node, `overrides` the command line's hydrali overrides."""

    def run(self) -> Report:
        """Measure every configured section, in order (1 and 4 together: they share their baselines)."""
        sections = [str(s) for s in self.bench.sections]
        for key in TIMED_TRAINING:
            warmup = self.bench[key].warmup
            if warmup < 1:
                raise HydraliError(
                    f"bench.{key}.warmup={warmup}: a training run's timer starts after a warm-up step, so it "
                    f"needs at least 1"
                )
        try:
            if any(name in sections for name in LOADER_SECTIONS):
                self.loaders(sections)
            for name in ONE_BY_ONE:
                if name in sections:
                    getattr(self, name)()
        finally:
            self.worker.stop()
        return self.report
