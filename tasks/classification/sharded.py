"""Classification data as WebDataset shards (hydrali.core.data.webdataset): what `hydrali convert` writes for each
image, and the sharded dataset that `data=webdataset` reads back.

A sample is the image file's bytes under its own extension (`jpg`, `png`, ...), its label as 4 bytes of little-endian
int32 (`label`: DALI's reader returns it as an int32 tensor, no Python in the pipeline) and as decimal text (`cls`:
WebDataset's convention, for other readers of the same shards).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hydrali.core.data import webdataset
from hydrali.core.errors import HydraliError
from hydrali.tasks.base import ShardedDataset
from hydrali.tasks.classification.datasets import ImageFolderInfo, dataset_params, image_files

TASK = "classification"
LABEL = "label"  # int32, little-endian
CLASS_TEXT = "cls"  # the label as decimal text
IMAGE = webdataset.IMAGE  # the image file, under its own extension


@dataclass(frozen=True)
class ShardedClassification(ShardedDataset):
    """A classification dataset read from shards: its classes and counts (from its manifest) and each split's tars."""

    classes: tuple[str, ...]
    train_per_class: tuple[int, ...] = ()
    class_weights: tuple[float, ...] | None = None  # the loss's weight of each class (task.class_weights); None: 1

    @property
    def num_classes(self) -> int:
        """The number of classes."""
        return len(self.classes)

    def params(self) -> dict:
        """What is logged to MLflow about the data: a folder's figures and the number of shards of each split."""
        return {**dataset_params(self), **self.shard_params()}


def open_shards(root: str) -> ShardedClassification:
    """The sharded dataset at `root` (a folder or s3:// prefix written by hydrali convert), its files checked."""
    manifest = webdataset.read_manifest(root)
    if manifest.task != TASK:
        raise HydraliError(
            f"data.root={root} holds {manifest.task} shards: train them with task={manifest.task}, or convert a "
            f"classification dataset"
        )
    try:
        classes = tuple(str(c) for c in manifest.facts["classes"])
        per_class = tuple(int(n) for n in manifest.facts.get("train_per_class", ()))
    except (KeyError, TypeError, ValueError) as err:
        raise HydraliError(
            f"{webdataset.MANIFEST} of {root} lacks its classes ({err}): convert the data again"
        ) from err
    train = webdataset.split_shards(root, manifest, "train")
    if len(per_class) != len(classes) or sum(per_class) != train.samples:
        raise HydraliError(
            f"{webdataset.MANIFEST} of {root} counts {sum(per_class)} training images over {len(per_class)} classes "
            f"but lists {train.samples} samples and {len(classes)} classes: convert the data again"
        )
    return ShardedClassification(
        root=str(root),
        classes=classes,
        train_shards=train,
        val_shards=webdataset.split_shards(root, manifest, "val"),
        train_per_class=per_class,
    )


def labelled_files(dataset: ImageFolderInfo, split: str) -> list[tuple[Path, int]]:
    """The image files of a split of a folder dataset with their labels, in DALI's reading order (files left out
    by data.bad_files=skip are not among them)."""
    split_dir = dataset.train_dir if split == "train" else dataset.val_dir
    listed = dataset.listed_files(split_dir)
    if listed is not None:
        return [(split_dir / name, label) for name, label in zip(*listed)]
    index = {name: i for i, name in enumerate(dataset.classes)}
    return [(path, index[path.parent.name]) for path in image_files([split_dir])]


def samples(dataset: ImageFolderInfo, split: str, seed: int | None) -> tuple[int, Iterator[dict]]:
    """(how many, the samples) of a split as hydrali convert writes them, shuffled with `seed` (None: in order)."""
    files = labelled_files(dataset, split)
    if seed is not None:
        random.Random(seed).shuffle(files)

    def each() -> Iterator[dict]:
        for number, (path, label) in enumerate(files):
            yield {
                webdataset.KEY: f"{number:08d}",
                path.suffix.lower().lstrip("."): path.read_bytes(),
                LABEL: struct.pack("<i", label),
                CLASS_TEXT: str(label).encode(),
            }

    return len(files), each()


def facts(dataset: ImageFolderInfo) -> dict:
    """What the manifest records about a classification dataset: its classes, in label order, and how many
    training images each has (task.class_weights=auto reads them)."""
    return {"classes": list(dataset.classes), "train_per_class": list(dataset.train_per_class)}
