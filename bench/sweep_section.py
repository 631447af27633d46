"""Section 8 (sweep): one sweep with Hydra's basic launcher (one job after another) and with hydrali's launcher
(jobs at once), interleaved, each sweep's wall time against its bound."""

from __future__ import annotations

from omegaconf import OmegaConf

from hydrali.bench.report import Row
from hydrali.bench.section_base import SectionBase
from hydrali.bench.timing import interleave
from hydrali.core.errors import HydraliError
from hydrali.core.run.run_dir import override_key

HYDRA_KEYS = ("hydra.", "hydra/")  # Hydra's own keys and config groups: not hydrali's config


class SweepSection(SectionBase):
    """Section 8 of a benchmark run: a sweep's wall time on each launcher."""

    def sweep_data(self, overrides: list[str]) -> list[str]:
        """Section 8's data.root override for a sweep of `overrides`: bench.sweep.root's photos, or where the
        overrides' data has no root of its own (experiment=cifar10's data=imagefolder), section 7's synthetic folder
        (written once, under paths.data_dir); none otherwise (e.g. the bundled digits)."""
        from hydra import compose

        from hydrali.core.errors import first_line

        root = self.bench.sweep.root
        if root is None:
            try:
                own = compose("config", overrides=[o for o in overrides if not override_key(o).startswith(HYDRA_KEYS)])
            except Exception as err:  # noqa: BLE001 - Hydra's composition errors have no common type
                raise HydraliError(f"bench.sweep.overrides: {first_line(err)}") from err
            if not OmegaConf.is_missing(own.data, "root"):
                return []
            root = self.small_synthetic(own.paths.data_dir)
        return [f"data.root={root}"]

    def sweep(self) -> None:
        """8: one sweep (bench.sweep.grid over bench.sweep.overrides), each repeat a whole `hydrali -m` command with
        Hydra's basic launcher (the baseline: one job after another, each on every GPU) and one with hydrali's
        launcher (jobs at once, each on bench.sweep.gpus_per_job GPUs), interleaved: each sweep's wall time against
        issue 49's bound, the share of the GPUs' wall time its jobs trained, and each job's best metric on both.
        Without a GPU it sweeps on the CPU when the overrides give the parallel launcher GPU ids
        (hydra.launcher.gpus=[0,1]: G is their count); else it is skipped.

        On the GPU machine, from the repository root, after `source bench/gpu/env.sh`:

            python3 -m hydrali.bench.cli bench.sections=[sweep] paths.data_dir=/tmp/data [bench.sweep.root=...]"""
        from hydrali.bench.sweep import (
            BASIC_LAUNCHER,
            GPUS_PER_JOB_KEY,
            PARALLEL,
            SEQUENTIAL,
            Figures,
            SweepRun,
            given_gpu_ids,
            launcher_only,
        )

        s = self.bench.sweep
        for key in ("gpus_per_job", "repeats"):
            if s[key] < 1:
                raise HydraliError(f"bench.sweep.{key}={s[key]}: give at least 1")
        both, launcher = launcher_only(list(s.overrides))
        ids = given_gpu_ids(launcher)
        if not self.machine.gpus and not ids:
            self.report.skip(
                "sweep",
                f"sweep {s.grid}: one job after another against at once",
                f"needs a GPU ({self.machine.no_gpu}); hydra.launcher.gpus=[0,1] in bench.sweep.overrides sweeps on "
                f"the CPU",
            )
            return
        base = [*both, *self.task_neutral_overrides()]
        base += self.sweep_data(base)
        settings = [*base, *s.grid.split()]
        if any(override_key(o) == "backend" and "keras" in o.partition("=")[2] for o in settings):
            if self._needs_tensorflow("sweep", f"sweep {s.grid}"):
                return
            library = self.bench.keras_library_path
        else:
            library = None
        gpus = len(ids) if ids else self.machine.gpus  # G: the GPUs the sweep may use
        device = "gpu" if self.machine.gpus else "cpu"
        folder = self.run_dir / "sweep"
        sequential = SweepRun(SEQUENTIAL, base, s.grid, [BASIC_LAUNCHER], folder / SEQUENTIAL, gpus, library)
        parallel = SweepRun(
            PARALLEL,
            base,
            s.grid,
            [f"{GPUS_PER_JOB_KEY}={s.gpus_per_job}", *launcher],
            folder / PARALLEL,
            gpus,
            library,
        )
        jobs, pairs = sequential.jobs, []
        baseline = self._add(
            pairs,
            Row(
                "sweep",
                f"sweep/{SEQUENTIAL}",
                f"{jobs} jobs ({s.grid}), hydra/launcher=basic: one after another, each on every GPU",
                device,
                short=SEQUENTIAL,
            ),
            sequential,
        )
        row = self._add(
            pairs,
            Row(
                "sweep",
                f"sweep/{PARALLEL}",
                f"{jobs} jobs ({s.grid}), hydrali's launcher: at once, {s.gpus_per_job} GPU(s) each",
                device,
                (baseline.key,),
                short=PARALLEL,
            ),
            parallel,
        )
        interleave(pairs, s.repeats)
        done = baseline.skipped is None
        for measured, figures in (
            (baseline, Figures(sequential.results, is_baseline=True)),
            (row, Figures(parallel.results, sequential.results if done else None)),
        ):
            if measured.skipped is None:
                measured.notes.update(figures.notes())
                measured.cells = figures.cells()
