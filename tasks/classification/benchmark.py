"""Throughput of a classification recipe: DALI on the CPU and on the GPU against a PIL baseline, in one run.

    python -m hydrali.tasks.classification.benchmark [overrides]       # e.g. pipeline=light data.batch_size=256

Overrides are hydrali's (data=imagefolder data.root=/data/imagenet ...). Without data.root, a set of
synthetic ImageNet-like JPEG files (400-640 x 300-480, quality 90) is written once under
paths.data_dir. Each loader decodes, random-resized-crops, flips and normalizes the training split
for `bench.batches` batches after `bench.warmup` batches; the table ends with each one's speed as a
ratio of the baseline measured in the same run: the usual PyTorch loader, a DataLoader with
pipeline.num_threads worker processes applying the same transforms with PIL.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

SYNTHETIC_CLASSES, SYNTHETIC_PER_CLASS = 8, 250
BENCH_DEFAULTS = {"warmup": 5, "batches": 40, "repeats": 3}


def write_synthetic(root: Path, classes: int = SYNTHETIC_CLASSES, train_per_class: int = SYNTHETIC_PER_CLASS,
                    val_per_class: int = 4) -> Path:
    """ImageNet-like JPEG files in train/ and val/ (written once, one process per core): smooth random colour
    fields of 400-640 x 300-480 pixels, quality 90, `classes` class folders of each split."""
    from concurrent.futures import ProcessPoolExecutor

    if (root / "train").is_dir():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
    jobs = [(tmp / split / f"class{c}", count, (seed, c)) for seed, (split, count) in
            enumerate((("train", train_per_class), ("val", val_per_class))) for c in range(classes)]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        list(pool.map(_write_class, *zip(*jobs)))
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


class PilTrainingSet:
    """The baseline's dataset: what a classification recipe does, with PIL, as a CHW float tensor. `standard`:
    random-resized crop (the recipe's random_area and random_aspect_ratio), resize, flip; `light`: resize the
    whole image, flip; both normalize with the recipe's mean and std and flip with its flip_probability."""

    def __init__(self, files: list[str], size: int, seed: int = 0, recipe: str = "standard", options: dict | None = None):
        self.files, self.size, self.seed, self.recipe = files, size, seed, recipe
        options = options or {}
        self.area = tuple(options.get("random_area", (0.08, 1.0)))
        self.aspect = tuple(options.get("random_aspect_ratio", (3 / 4, 4 / 3)))
        self.flip = float(options.get("flip_probability", 0.5))
        self.mean = tuple(options.get("mean", (0.485, 0.456, 0.406)))
        self.std = tuple(options.get("std", (0.229, 0.224, 0.225)))

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


def time_dataloader(files: list[str], size: int, batch: int, workers: int, warmup: int, batches: int) -> float:
    """Images per second of the baseline: torch DataLoader, `workers` processes, shuffled, as in training."""
    from torch.utils.data import DataLoader

    loader = DataLoader(PilTrainingSet(files, size), batch_size=batch, shuffle=True, num_workers=workers,
                        drop_last=True, persistent_workers=True, prefetch_factor=4)

    def batches_forever():
        while True:
            yield from loader

    stream = batches_forever()
    for _ in range(warmup):
        next(stream)
    start = time.perf_counter()
    for _ in range(batches):
        next(stream)
    return batches * batch / (time.perf_counter() - start)


def time_dali(pipe, warmup: int, batches: int, gpu: bool) -> float:
    """Images per second of a built DALI pipeline, its outputs ready (on the GPU: synchronized)."""
    for _ in range(warmup):
        pipe.run()
    start = time.perf_counter()
    for _ in range(batches):
        out = pipe.run()
    if gpu:
        out[0].as_cpu()  # waits for the GPU work of the last batch
    return batches * pipe.max_batch_size / (time.perf_counter() - start)


def main(argv: list[str]) -> None:
    """Compose hydrali's config from `argv`, measure every loader, print the table."""
    from hydra import compose, initialize_config_module
    from hydra.utils import instantiate
    from omegaconf import open_dict

    from hydrali.core.devices import cuda_device_count
    from hydrali.core.plan import make_plan
    from hydrali.core.schema import register_schemas
    from hydrali.core.topology import detect
    from hydrali.tasks.classification.datasets import scan_image_folder

    register_schemas()
    bench = dict(BENCH_DEFAULTS)
    overrides = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.startswith("bench.") and key[len("bench."):] in bench:
            bench[key[len("bench."):]] = int(value)
        else:
            overrides.append(arg)
    with initialize_config_module(config_module="hydrali.conf", version_base="1.3"):
        cfg = compose("config", overrides=["paths.root=" + os.getcwd(), "paths.output_dir=.", *overrides])
    with open_dict(cfg):
        if cfg.data.name == "digits":  # too small to measure: use synthetic ImageNet-like files
            cfg.data.root = str(write_synthetic(Path(cfg.paths.data_dir) / "synthetic-imagenet"))
            cfg.data.image_size = 224
    task = instantiate(cfg.task)
    info = scan_image_folder(cfg.data.root)
    files = sorted(str(p) for p in info.train_dir.glob("*/*"))
    batch, threads = cfg.data.batch_size, cfg.pipeline.num_threads
    devices = ["cpu"] + (["gpu"] if cuda_device_count() > 0 else [])
    print(f"{len(files)} training files under {info.train_dir}; batch {batch}, image {cfg.data.image_size}, "
          f"{threads} threads/workers, recipe {cfg.pipeline.name}; median of {bench['repeats']} x "
          f"{bench['batches']} batches", flush=True)

    rows = []
    for repeat in range(bench["repeats"]):  # interleaved, so that drift hits every loader alike
        rows.append(("torch DataLoader + PIL (baseline)", "cpu", time_dataloader(
            files, cfg.data.image_size, batch, threads, bench["warmup"], bench["batches"])))
        for device in devices:
            plan = make_plan(topology=detect(1, 1, env={}), batch_size=batch, base_lr=0.1, ref_batch=256,
                             rule="none", warmup_epochs=0, epochs=1, seed=repeat, device=device)
            pipe = task.build_pipeline(pipeline=cfg.pipeline, data=cfg.data, model=cfg.model, dataset=info, plan=plan,
                                       shard=plan.shard, layout="CHW", is_training=True)
            pipe.build()
            label = f"DALI {cfg.pipeline.name}, {'mixed decode' if device == 'gpu' else 'CPU decode'}"
            rows.append((label, device, time_dali(pipe, bench["warmup"], bench["batches"], device == "gpu")))
            del pipe
    print_table(rows)


def print_table(rows: list[tuple[str, str, float]]) -> None:
    """The median images/s of each loader and its ratio to the baseline's median."""
    names = list(dict.fromkeys((name, device) for name, device, _ in rows))
    medians = {key: float(np.median([v for n, d, v in rows if (n, d) == key])) for key in names}
    base = medians[names[0]]
    print("\n| loader | device | images/s (median) | vs baseline |\n| --- | --- | --- | --- |")
    for (name, device), value in medians.items():
        print(f"| {name} | {device} | {value:,.0f} | {value / base:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])
