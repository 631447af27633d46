"""What hydrali-bench's classification sections read (bench/section_base.py, loaders.py): a synthetic
ImageNet-like JPEG folder written once, a synthetic CIFAR-like folder of 32 x 32 photos written once (section 7,
small), and the PIL baseline's dataset doing a recipe's work with PIL.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def write_synthetic(root: Path, classes: int, train_per_class: int, val_per_class: int) -> Path:
    """ImageNet-like JPEG files in train/ and val/ (written once, one process per core): smooth random colour
    fields of 400-640 x 300-480 pixels, quality 90, `classes` class folders of each split."""
    return _write_splits(root, classes, train_per_class, val_per_class, _write_class)


SMALL_SIDE = 32  # the small photos' side, in pixels (CIFAR's)
SMALL_QUALITY = 75  # their JPEG quality (that of ../shared/data/cifar10.tgz: about 0.9 KB a photo)


def write_small_synthetic(root: Path, classes: int, train_per_class: int, val_per_class: int) -> Path:
    """CIFAR-like JPEG files in train/<class>/ and val/<class>/ (written once, one process per core): 32 x 32 RGB
    photos, quality 75, smooth random colour fields with pixel noise (about 0.9 KB a file, as CIFAR-10's photos
    at that quality), `classes` class folders of each split. What section 7 (small) reads when no real set is
    given (bench.small.root)."""
    return _write_splits(root, classes, train_per_class, val_per_class, _write_small_class)


def _write_splits(root: Path, classes: int, train_per_class: int, val_per_class: int, write_class) -> Path:
    """train/ and val/ of `classes` class folders under `root`, each written by `write_class(folder, count, seed)`
    in a pool of one process per core, into a temporary folder renamed to `root` at the end (so that an interrupted
    write leaves no half folder); nothing is written when `root` has a train/ folder already."""
    from concurrent.futures import ProcessPoolExecutor

    if (root / "train").is_dir():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
    jobs = [
        (tmp / split / f"class{c}", count, (seed, c))
        for seed, (split, count) in enumerate((("train", train_per_class), ("val", val_per_class)))
        for c in range(classes)
    ]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        list(pool.map(write_class, *zip(*jobs)))
    tmp.rename(root)
    return root


def _write_class(folder: Path, count: int, seed: tuple[int, int]) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(count):
        w, h = int(rng.integers(400, 641)), int(rng.integers(300, 481))
        small = rng.integers(0, 256, size=(h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        Image.fromarray(small).resize((w, h), Image.Resampling.BILINEAR).save(folder / f"{i}.jpg", quality=90)


def _write_small_class(folder: Path, count: int, seed: tuple[int, int]) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    side = SMALL_SIDE
    for i in range(count):
        field = rng.integers(0, 256, size=(5, 5, 3), dtype=np.uint8)
        smooth = np.asarray(Image.fromarray(field).resize((side, side), Image.Resampling.BICUBIC), dtype=np.float32)
        noisy = np.clip(smooth + rng.normal(0.0, 10.0, size=(side, side, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(folder / f"{i}.jpg", quality=SMALL_QUALITY)


class PilTrainingSet:
    """The baseline's dataset: what a classification recipe does, with PIL, as a CHW float tensor. `standard`:
    random-resized crop (the recipe's random_area and random_aspect_ratio), resize, flip; `light`: resize the
    whole image, flip; both normalize with the recipe's mean and std and flip with its flip_probability."""

    def __init__(self, files: list[str], size: int, seed: int, recipe: str, options: dict):
        self.files, self.size, self.seed, self.recipe = files, size, seed, recipe
        crops = recipe == "standard"  # `light` resizes the whole image: it declares no crop
        self.area = tuple(options["random_area"]) if crops else None
        self.aspect = tuple(options["random_aspect_ratio"]) if crops else None
        self.flip = float(options["flip_probability"])
        self.mean, self.std = tuple(options["mean"]), tuple(options["std"])

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        import torch
        from PIL import Image

        rng = np.random.default_rng((self.seed, index))
        with Image.open(self.files[index]) as img:
            img = img.convert("RGB")
            if self.recipe == "standard":
                w, h = img.size
                area = w * h * rng.uniform(*self.area)
                ratio = np.exp(rng.uniform(np.log(self.aspect[0]), np.log(self.aspect[1])))
                cw, ch = min(w, int(round(np.sqrt(area * ratio)))), min(h, int(round(np.sqrt(area / ratio))))
                x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
                img = img.crop((x, y, x + cw, y + ch))
            img = img.resize((self.size, self.size), Image.Resampling.BILINEAR)
            if rng.random() < self.flip:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        arr = (np.asarray(img, dtype=np.float32) / 255.0 - self.mean) / self.std
        return torch.from_numpy(arr.transpose(2, 0, 1).astype(np.float32)), 0
