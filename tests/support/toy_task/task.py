"""task=brightness, framework-neutral: the images it writes, its DALI pipelines and their outputs' names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from hydrali.core.contracts.task import Dataset
from hydrali.core.data.pipelines import Source
from hydrali.core.run.plan import Plan, Shard
from hydrali.tasks.base import DaliTask

CLASSES = ("bright", "dark")  # DALI's file reader labels class folders in sorted order: bright 0, dark 1


@dataclass(frozen=True)
class BrightnessData:
    """The written images (hydrali.core.contracts.task.Dataset): counts for the epoch steps, params to log."""

    root: Path
    num_train: int
    num_val: int
    num_classes: int = len(CLASSES)
    skipped: tuple = ()

    def params(self) -> dict:
        """What is logged about the data."""
        return {"dataset/num_train": self.num_train, "dataset/num_val": self.num_val}


def write_images(root: Path, per_class: int) -> Path:
    """Write `per_class` noisy grey 16x16 PNG files per class and split under `root` (once)."""
    import numpy as np
    from PIL import Image

    marker = root / "written"
    if marker.exists():
        return root
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                level = rng.uniform(150, 240) if name == "bright" else rng.uniform(15, 105)
                pixels = np.clip(rng.normal(level, 20, (16, 16, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:04d}.png")
    marker.write_text(str(per_class))
    return root


@dataclass(kw_only=True)
class BrightnessTask(DaliTask):
    """Is an image dark or bright: images and class labels, the validation error rate as its metric."""

    def prepare_data(self, data: DictConfig, verify: str) -> Dataset:
        """Write the images if need be, then check them as `verify` says."""
        root = write_images(Path(data.root), data.images_per_class)
        dataset = BrightnessData(root, data.images_per_class * 2, data.images_per_class * 2)
        self.check_prepared(data, dataset, verify, classes_in=f"{root}/train")
        return dataset

    def image_files(self, dataset: BrightnessData) -> list[Path]:
        """Every written PNG file."""
        return sorted(dataset.root.glob("*/*/*.png"))

    def source(self, dataset: BrightnessData, shard: Shard, plan: Plan, is_training: bool) -> Source:
        """The split's class folders, this replica's shard of them."""
        split = dataset.root / ("train" if is_training else "val")
        return Source(str(split), shard.shard_id, plan.num_shards, is_training)

    def output_names(self, is_training: bool) -> tuple[str, ...]:
        """What the recipe returns, in order."""
        return ("images", "labels")

    def output_specs(self, *, batch: int, image_size: int, image_dtype: str, is_training: bool, model: DictConfig):
        """(shape, dtype) of each batched output, HWC."""
        return ((batch, image_size, image_size, 3), image_dtype), ((batch, 1), "int32")

    def artifacts(self) -> list:
        """Files the task wrote for the tracker: none."""
        return []
