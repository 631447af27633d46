"""Section 7 (small): 32 x 32 photos (experiment=cifar10) through the Lightning backend, read from the files every
epoch and decoded once into memory, against the network's upper bound."""

from __future__ import annotations

from omegaconf import DictConfig

from hydrali.bench.report import Row
from hydrali.bench.section_base import SectionBase
from hydrali.bench.timing import interleave

FROM_FILES, DECODED_ONCE = "false", "true"  # the pipeline.options.decode_once values the section compares


class SmallSection(SectionBase):
    """Section 7 of a benchmark run: small images' training images/s."""

    def small_configs(self) -> dict[str, DictConfig]:
        """Section 7's two hydrali configs, by decode_once ("false", "true"): bench.small.overrides (experiment=cifar10)
        with the experiment's own batch and image size, then the command line's pipeline.*, seed and paths.*
        overrides, the Lightning backend, and the photos of bench.small.root or the synthetic folder (written here
        once, under paths.data_dir)."""
        from hydra import compose

        small = self.bench.small
        base = [*small.overrides, *self.task_neutral_overrides()]
        # the experiment's batch and image size: conf/bench.yaml's own data.* (ImageNet-like) would win over it
        own = compose("config", overrides=base)
        batch = own.data.get("global_batch") or own.data.batch_size  # one GPU: a fixed global batch is its batch
        base = [*base, f"data.batch_size={batch}", "data.global_batch=null", f"data.image_size={own.data.image_size}"]
        root = small.root if small.root is not None else self.small_synthetic(own.paths.data_dir)
        base = [*base, "data=imagefolder", f"data.root={root}", "backend=lightning"]
        return {
            once: self.compose([*base, f"pipeline.options.decode_once={once}"]) for once in (FROM_FILES, DECODED_ONCE)
        }

    def small(self) -> None:
        """7: 32 x 32 photos through the Lightning backend (bench.small.overrides: experiment=cifar10, its network,
        recipe and batch), read from the files every epoch and decoded once into memory (pipeline.options.decode_once),
        against the network's upper bound (its steps on one batch already on the GPU). The photos: bench.small.root,
        or a synthetic CIFAR-like folder written once under paths.data_dir.

        On the GPU machine, after ../shared/device/stage-wheels, from the repository root (bench/gpu/small.sh sources
        bench/gpu/env.sh, runs this section alone with the given overrides and prints its table):

            bash bench/gpu/small.sh                                     # the synthetic folder (bench.small.synthetic)
            bash bench/gpu/small.sh bench.small.root=/tmp/cifar/cifar   # CIFAR-10's JPEG files (.devdata/cifar10.tgz
                                                                        #   carried in the checkout, unpacked there)

        which is, after `source bench/gpu/env.sh`:

            python3 -m hydrali.bench.cli bench.sections=[small] paths.data_dir=/tmp/data [bench.small.root=...]"""
        if self._needs_gpu("small", "32 px training (experiment=cifar10): upper bound, files, decode_once"):
            return
        small, pairs = self.bench.small, []
        steps = self.step_counts("small")
        configs = self.small_configs()
        files_cfg, once_cfg = configs[FROM_FILES], configs[DECODED_ONCE]
        task, dataset = self.task_and_data(files_cfg)
        more = f"a larger set than bench.small.root={small.root}" if small.root else None
        self._check_steps(files_cfg, dataset, "small", more or "bench.small.synthetic.train_per_class")
        what = f"{self.training_label(files_cfg, ' '.join(small.overrides))}, {files_cfg.data.image_size} px"
        bound = self._torch_bound_row(
            pairs, "small", "small/bound", what, task, files_cfg, dataset, steps, "upper bound"
        )
        files = self._add(
            pairs,
            Row(
                "small",
                "small/lightning/files",
                f"{what}: hydrali, Lightning, files read every epoch (decode_once=false)",
                "gpu",
                (bound.key,),
                short="files",
            ),
            self.lightning_training(files_cfg, "small-files", steps),
        )
        self._add(
            pairs,
            Row(
                "small",
                "small/lightning/decode_once",
                f"{what}: hydrali, Lightning, decoded once into memory (decode_once=true)",
                "gpu",
                (bound.key, files.key),
                short="decode_once",
            ),
            self.lightning_training(once_cfg, "small-decode-once", steps),
        )
        interleave(pairs, self.bench.repeats)
