"""Sections 1 (loaders) and 4 (cpu): each recipe through hydrali's data layers, against raw DALI and the PIL
DataLoader; DALI's CPU operators against the PIL DataLoader on the same cores."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from hydrali.bench.report import Row
from hydrali.bench.section_base import KERAS_LOOPS, TORCH_LAYOUT, SectionBase, plain
from hydrali.bench.timing import interleave
from hydrali.bench.worker import Remote

KERAS_LAYOUT = "HWC"  # the layout the Keras layer reads


class LoaderSections(SectionBase):
    """Sections 1 and 4 of a benchmark run: the loaders' images/s."""

    def loaders(self, sections: list[str]) -> None:
        """1: each recipe through hydrali's data layers, against raw DALI and the PIL DataLoader;
        4: DALI's CPU operators against the PIL DataLoader on the same cores."""
        from hydrali.bench.loaders import LightningLayer, with_threads
        from hydrali.core.data.devices import resolve_device

        b, pairs = self.bench, []
        workers = b.workers or self.machine.cores
        for recipe in b.recipes:
            cfg = self.classification([f"pipeline={recipe}"], drop=("pipeline",))
            task, dataset = self.task_and_data(cfg)
            if not hasattr(dataset, "train_dir"):  # shards (data=webdataset): no image files for the PIL baseline
                for section in sections:
                    self.report.skip(section, f"{recipe} recipe through the data layers", "needs an image folder")
                continue
            files = sorted(str(p) for p in Path(dataset.train_dir).glob("*/*"))
            if "loaders" in sections:
                device = resolve_device(str(cfg.pipeline.device), self.machine.gpus)
                pil = self._pil(pairs, "loaders", recipe, files, cfg, workers)
                raw = self._raw_dali(pairs, "loaders", recipe, task, cfg, dataset, device, TORCH_LAYOUT, pil)
                if "lightning" in b.layers:
                    self._add(
                        pairs,
                        Row(
                            "loaders",
                            f"layer/lightning/{recipe}/{device}",
                            f"hydrali data layer, Lightning ({recipe})",
                            device,
                            (raw.key, pil.key),
                        ),
                        LightningLayer(task, cfg, dataset, device, **self.loader_counts()),
                    )
                if "keras" in b.layers and not self._needs_tensorflow(
                    "loaders", f"hydrali data layer, Keras ({recipe})"
                ):
                    raw_hwc = self._raw_dali(pairs, "loaders", recipe, task, cfg, dataset, device, KERAS_LAYOUT, pil)
                    self._add(
                        pairs,
                        Row(
                            "loaders",
                            f"layer/keras/{recipe}/{device}",
                            f"hydrali data layer, Keras ({recipe})",
                            device,
                            (raw_hwc.key, pil.key),
                        ),
                        Remote(
                            self.worker,
                            f"{KERAS_LOOPS}.keras_layer",
                            cfg=plain(cfg),
                            device=device,
                            **self.loader_counts(),
                        ),
                    )
            if "cpu" in sections:
                cores = b.cpu_threads or self.machine.cores
                pil = self._pil(pairs, "cpu", recipe, files, cfg, cores)
                self._raw_dali(pairs, "cpu", recipe, task, with_threads(cfg, cores), dataset, "cpu", TORCH_LAYOUT, pil)
        interleave(pairs, b.repeats)

    def _pil(self, pairs: list, section: str, recipe: str, files: list[str], cfg: DictConfig, workers: int) -> Row:
        """The row of `section` timing the PIL DataLoader over `files` with `workers` workers (the baseline)."""
        from hydrali.bench.loaders import PilLoader

        return self._add(
            pairs,
            Row(
                section, f"pil/{recipe}/{workers}", f"PIL DataLoader ({recipe}), {workers} workers", "cpu", short="PIL"
            ),
            PilLoader(files, cfg, recipe, workers, **self.loader_counts()),
        )

    def _raw_dali(
        self, pairs: list, section: str, recipe: str, task, cfg: DictConfig, dataset, device: str, layout: str, pil: Row
    ) -> Row:
        """The row of `section` timing the recipe's DALI pipeline alone (`layout`, on `device`, cfg's threads),
        against the PIL DataLoader's row `pil`."""
        from hydrali.bench.loaders import RawDali

        threads = cfg.pipeline.num_threads
        return self._add(
            pairs,
            Row(
                section,
                f"raw/{recipe}/{device}/{threads}/{layout}",
                f"raw DALI {recipe} ({layout}), {threads} threads",
                device,
                (pil.key,),
                short="raw DALI" if layout == TORCH_LAYOUT else f"raw DALI {layout}",
            ),
            RawDali(task, cfg, dataset, device, layout, **self.loader_counts()),
        )
