"""Section 6 (scaling): whole hydrali runs on 1 GPU and on several, per configured run, each N-GPU row against its
1-GPU row."""

from __future__ import annotations

from hydrali.bench.report import Row
from hydrali.bench.section_base import SectionBase
from hydrali.bench.timing import interleave
from hydrali.core.run.run_dir import override_key

HYDRA_NODE = "hydra."  # the keys of Hydra's own node: each run sets its own (its run dir)


class ScalingSection(SectionBase):
    """Section 6 of a benchmark run: how hydrali's images/s grow with its GPUs."""

    def scaling(self) -> None:
        """6: whole hydrali runs on 1 GPU and on several (every visible one, or bench.scaling.devices), per
        configured run (a backend and its settings), interleaved; each N-GPU row against its 1-GPU row."""
        from hydrali.bench.scaling import ScalingRun, device_counts

        s, pairs = self.bench.scaling, []
        requested = [int(n) for n in s.devices]
        if not self.machine.gpus and not requested:
            self.report.skip(
                "scaling",
                "hydrali runs on 1 GPU and on several",
                f"needs a GPU ({self.machine.no_gpu}); bench.scaling.devices=[2] measures CPU replicas",
            )
            return
        counts = device_counts(requested, self.machine.gpus)
        mine = [o for o in self.overrides if not override_key(o).startswith(HYDRA_NODE)]
        cfg = self.compose(mine)
        # the bundled digits are too few for several GPUs: a synthetic folder
        data = self.synthetic_imagenet(cfg.paths.data_dir, s.synthetic) if cfg.data.name == "digits" else []
        kind = "GPU" if self.machine.gpus else "CPU replica"
        device = "gpu" if self.machine.gpus else "cpu"
        for index, variant in enumerate(s.runs):
            settings = variant.split()
            keras = any(override_key(o) == "backend" and o.endswith("=keras") for o in settings)
            if keras and self._needs_tensorflow("scaling", variant):
                continue
            base = None
            for devices in counts:
                row = self._add(
                    pairs,
                    Row(
                        "scaling",
                        f"scaling/{index}/{devices}",
                        f"{variant} on {devices} {kind}{'s' if devices > 1 else ''}",
                        device,
                        (base.key,) if base is not None else (),
                        short=f"{devices} {kind}",
                    ),
                    ScalingRun(
                        [*s.overrides, *data, *settings, *mine],
                        devices,
                        self.run_dir / "scaling" / f"{index}-{devices}",
                        self.bench.keras_library_path if keras else None,
                    ),
                )
                base = base or row
        interleave(pairs, self.bench.repeats)
