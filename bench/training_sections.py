"""Sections 2 (lightning), 3 (keras) and 5 (detection): a network's training through each backend, against its
upper bound (the same network and settings on one batch already on the GPU) and a plain loop fed by the same DALI
pipeline; and for the detector, the ssd recipe alone (DALI, GPU and CPU)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from hydrali.bench.machine import Machine
from hydrali.bench.report import Row
from hydrali.bench.section_base import NO_TENSORFLOW, TORCH_LAYOUT, SectionBase
from hydrali.bench.timing import interleave


class TrainingSections(SectionBase):
    """Sections 2, 3 and 5 of a benchmark run: training images/s on each backend."""

    def __init__(self, bench: DictConfig, overrides: list[str], run_dir: Path, machine: Machine):
        super().__init__(bench, overrides, run_dir, machine)
        self._compiled_lightning: list[str] = []  # keys of section 2's compiled hydrali rows (section 3 compares)

    def lightning(self) -> None:
        """2: the network through the Lightning backend, against its upper bound (batches already on the GPU)
        and a plain PyTorch loop fed by the same DALI pipeline, per configured variant."""
        if self._needs_gpu("lightning", "training through the Lightning backend, upper bound, plain loop"):
            return
        t, pairs = self.bench.train, []
        steps = self.step_counts()
        for index, variant in enumerate(t.lightning):
            cfg = self.classification([*t.overrides, *variant.split()])
            task, dataset = self.task_and_data(cfg)
            self._check_steps(cfg, dataset)
            what = self.training_label(cfg, variant)
            bound = self._torch_bound_row(
                pairs, "lightning", f"train/torch/bound/{variant}", what, task, cfg, dataset, steps, "upper bound"
            )
            loop = self._add(
                pairs,
                Row(
                    "lightning",
                    f"train/torch/dali/{variant}",
                    f"{what}: plain PyTorch loop fed by DALI",
                    "gpu",
                    (bound.key,),
                    short="plain loop",
                ),
                self.torch_loop(task, cfg, dataset, "dali", steps),
            )
            self._add(
                pairs,
                Row(
                    "lightning",
                    f"train/lightning/{variant}",
                    f"{what}: hydrali, Lightning backend",
                    "gpu",
                    (bound.key, loop.key),
                    short=f"Lightning {'compiled' if cfg.backend.compile else 'eager'}",
                ),
                self.lightning_training(cfg, f"lightning{index}", steps),
            )
            if cfg.backend.compile:
                self._compiled_lightning.append(f"train/lightning/{variant}")
        interleave(pairs, self.bench.repeats)

    def keras(self) -> None:
        """3: the network through the Keras backend against Keras' own upper bound, per configured variant."""
        if self._needs_gpu("keras", "training through the Keras backend, Keras' upper bound"):
            return
        if self._needs_tensorflow("keras", "training through the Keras backend"):
            return
        t, pairs = self.bench.train, []
        steps = self.step_counts()
        for index, variant in enumerate(t.keras):
            cfg = self.classification([*t.overrides, "backend=keras", *variant.split()])
            self._check_steps(cfg, self.task_and_data(cfg)[1])
            what = self.training_label(cfg, variant)
            bound = self._keras_bound_row(pairs, "keras", f"train/keras/bound/{variant}", what, cfg)
            for per_call in t.keras_loops:  # the same train step fed by the DALIDataset, as fit() runs it
                self._add(
                    pairs,
                    Row(
                        "keras",
                        f"train/keras/dali/{per_call}/{variant}",
                        f"{what}: plain Keras loop fed by DALI, {per_call} step(s) per call",
                        "gpu",
                        (bound.key,),
                        short=f"plain Keras loop ({per_call} per call)",
                    ),
                    self.keras_bound(cfg, steps, feed="dali", per_call=per_call),
                )
            self._add(
                pairs,
                Row(
                    "keras",
                    f"train/keras/{variant}",
                    f"{what}: hydrali, Keras backend",
                    "gpu",
                    (bound.key, *self._compiled_lightning),  # Keras against compiled Lightning, where measured
                ),
                self.keras_training(cfg, f"keras{index}", steps),
            )
        interleave(pairs, self.bench.repeats)

    def _keras_bound_row(self, pairs: list, section: str, key: str, what: str, cfg: DictConfig) -> Row:
        """The row of `section` timing Keras' own train step of `cfg` on GPU tensors (`what`: the network and
        settings): a Keras row's upper bound."""
        return self._add(
            pairs,
            Row(section, key, f"{what}: Keras train_step on GPU tensors (upper bound)", "gpu", short="Keras bound"),
            self.keras_bound(cfg, self.step_counts()),
        )

    def detection(self) -> None:
        """5: the ssd recipe alone (DALI, GPU and CPU) and the detector's training on each backend, each against
        its own upper bound (the same network and settings on one batch already on the GPU)."""
        from hydrali.bench.loaders import RawDali

        base = ["task=detection", *self.bench.detection.overrides, *self.task_neutral_overrides()]
        cfg = self.compose(base)
        task, dataset = self.task_and_data(cfg)
        b, pairs = self.bench, []
        loader = self.loader_counts()
        name, threads = cfg.pipeline.name, cfg.pipeline.num_threads
        cpu = self._add(
            pairs,
            Row(
                "detection",
                f"det/raw/{name}/cpu/{threads}",
                f"raw DALI {name}, CPU operators, {threads} threads, batch {cfg.data.batch_size}",
                "cpu",
                short="CPU recipe",
            ),
            RawDali(task, cfg, dataset, "cpu", TORCH_LAYOUT, **loader),
        )
        if self._needs_gpu("detection", f"raw DALI {name} mixed decode; detector training on both backends"):
            interleave(pairs, b.repeats)
            return
        gpu = self._add(
            pairs,
            Row(
                "detection",
                f"det/raw/{name}/gpu/{threads}",
                f"raw DALI {name}, mixed decode, {threads} threads, batch {cfg.data.batch_size}",
                "gpu",
                (cpu.key,),
                short="GPU recipe",
            ),
            RawDali(task, cfg, dataset, "gpu", TORCH_LAYOUT, **loader),
        )
        self._check_steps(cfg, dataset)
        steps = self.step_counts()
        model = cfg.model._target_.rpartition(".")[2]
        what = self.training_label(cfg, "lightning")
        light_bound = self._torch_bound_row(
            pairs, "detection", "det/train/lightning/bound", what, task, cfg, dataset, steps, "Lightning bound"
        )
        light = self._add(
            pairs,
            Row(
                "detection",
                "det/train/lightning",
                f"{model} training, hydrali, Lightning",
                "gpu",
                (light_bound.key, gpu.key),
                short="Lightning",
            ),
            self.lightning_training(cfg, "detection-lightning", steps),
        )
        if not self._needs_tensorflow("detection", f"{model} training, hydrali, Keras", NO_TENSORFLOW):
            kcfg = self.compose([*base, "backend=keras"])
            what = self.training_label(kcfg, "keras")
            keras_bound = self._keras_bound_row(pairs, "detection", "det/train/keras/bound", what, kcfg)
            self._add(
                pairs,
                Row(
                    "detection",
                    "det/train/keras",
                    f"{model} training, hydrali, Keras",
                    "gpu",
                    (keras_bound.key, gpu.key, light.key),
                ),
                self.keras_training(kcfg, "detection-keras", steps),
            )
        interleave(pairs, b.repeats)
