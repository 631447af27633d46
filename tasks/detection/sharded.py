"""Detection data as WebDataset shards (hydrali.core.data.webdataset): what `hydrali convert task=detection` writes for
each image, and the sharded dataset that `data=webdataset_detection` reads back.

A sample holds what `fn.readers.coco(ltrb=True, ratio=True)` gives for the image, so that the recipes run the same
steps after either reader:

    <key>.<ext>       the image file's bytes under its own extension (jpg, png, ...)
    <key>.boxes       float32 little-endian, N x 4: ltrb relative to the image, clamped to [0, 1]
    <key>.labels      int32 little-endian, N: 1..K in the sorted order of the category ids (0 is the background)
    <key>.image_id    int32 little-endian: the image's id in the annotation file

An image without boxes has zero-byte `boxes` and `labels` (DALI reads them as empty tensors). Training skips such
images, as readers.coco does in training (skip_empty): they are left out of the train split when it is written, so
that the manifest counts what the reader yields. The val split keeps every image, and its COCO annotation file (the
cleaned one a run scores against) is written beside its shards (val/annotations.json) so that the mAP of a run
trained from shards is computed as from the folder.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hydrali.core.data import object_store, webdataset
from hydrali.core.errors import HydraliError
from hydrali.tasks.base import ShardedDataset
from hydrali.tasks.detection.coco import CocoInfo, CocoSplit, DetectionDataset, contiguous_labels, load_coco_json

TASK = "detection"
BOXES = "boxes"  # float32 N x 4, little-endian
LABELS = "labels"  # int32 N, little-endian
IMAGE_ID = "image_id"  # int32, little-endian
IMAGE = webdataset.IMAGE  # the image file, under its own extension
VAL_ANNOTATIONS = "val/annotations.json"  # the val split's COCO file, relative to the shards' root
INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class ShardedDetection(DetectionDataset, ShardedDataset):
    """A detection dataset read from shards: each split's tars (the train split's images all have boxes, the val
    split holds every image), and the val split as scoring sees it (its COCO annotation file, a local copy when the
    shards are in object storage; no image folder)."""

    val: CocoSplit
    train_boxes: int

    def params(self) -> dict:
        """What is logged to MLflow about the data: a folder's figures and the number of shards of each split."""
        return {**super().params(), **self.shard_params()}


def open_shards(root: str, local_copies: Path) -> ShardedDetection:
    """The sharded dataset at `root` (a folder or s3:// prefix written by hydrali convert task=detection), its files
    checked; the val annotation file of shards in object storage is copied under `local_copies` to be scored."""
    manifest = webdataset.read_manifest(root)
    where = object_store.join(root, webdataset.MANIFEST)
    if manifest.task != TASK:
        raise HydraliError(
            f"data.root={root} holds {manifest.task} shards: train them with task={manifest.task} data=webdataset, "
            f"or convert a detection dataset"
        )
    try:
        categories = [(int(c["id"]), str(c["name"])) for c in manifest.facts["categories"]]
        annotations = str(manifest.facts["val_annotations"])
        train_boxes = int(manifest.facts["train_boxes"])
    except (KeyError, TypeError, ValueError) as err:
        raise HydraliError(f"{where} lacks the detection facts ({err}): convert the data again") from err
    train = webdataset.split_shards(root, manifest, "train")
    val_shards = webdataset.split_shards(root, manifest, "val")
    annotation_file = _local_annotations(object_store.join(root, annotations), local_copies)
    data = load_coco_json(annotation_file)
    ids = tuple(sorted(cid for cid, _ in categories))
    names = dict(categories)
    if sorted(int(c["id"]) for c in data["categories"]) != list(ids) or len(data["images"]) != val_shards.samples:
        raise HydraliError(
            f"{annotation_file} does not describe the val shards of {where} ({len(data['images'])} images, "
            f"{val_shards.samples} samples; its categories against the manifest's): convert the data again"
        )
    val = CocoSplit(
        images_dir=Path(annotation_file).parent,  # no image files: the images are in the shards
        annotation_file=Path(annotation_file),
        num_images=val_shards.samples,
        num_boxes=len(data["annotations"]),
        category_ids=ids,
        category_names=tuple(names[i] for i in ids),
    )
    return ShardedDetection(str(root), train, val_shards, val, train_boxes)


def _local_annotations(location: str, local_copies: Path) -> Path:
    """The annotation file at `location` as a local path: itself, or a copy of the object written under
    `local_copies`."""
    if not object_store.is_remote(location):
        if not Path(location).is_file():
            raise HydraliError(f"{location} is missing: the shards' val annotation file; convert the data again")
        return Path(location)
    copy = local_copies / "webdataset" / location.removeprefix("s3://").replace("/", "_")
    return object_store.write_local_copy(location, copy)  # every process of the job writes it; others read it


def _boxes_and_labels(annotations: list[dict], image: dict, labels_of: dict[int, int]) -> tuple[bytes, bytes]:
    """An image's boxes (float32 N x 4, ltrb relative to the image, in [0, 1]) and labels (int32 N) as bytes,
    computed in float32 as readers.coco computes them."""
    if not annotations:
        return b"", b""
    xywh = np.array([a["bbox"] for a in annotations], dtype=np.float32)
    ltrb = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
    ltrb /= np.array([image["width"], image["height"]] * 2, dtype=np.float32)
    boxes = np.clip(ltrb, 0.0, 1.0).astype("<f4")
    labels = np.array([labels_of[a["category_id"]] for a in annotations], dtype="<i4")
    return boxes.tobytes(), labels.tobytes()


def samples(dataset: CocoInfo, split: str, seed: int | None) -> tuple[int, Iterator[dict]]:
    """(how many, the samples) of a split as hydrali convert writes them, shuffled with `seed` (None: in the
    annotation file's order); the train split without the images that have no boxes."""
    part = dataset.train if split == "train" else dataset.val
    data = load_coco_json(part.annotation_file)
    labels_of = contiguous_labels(part.category_ids)
    boxes_of = defaultdict(list)
    for annotation in data["annotations"]:
        boxes_of[annotation["image_id"]].append(annotation)
    images = [image for image in data["images"] if split != "train" or boxes_of[image["id"]]]
    for image in images:
        if not INT32.min <= image["id"] <= INT32.max:
            raise HydraliError(
                f"{part.annotation_file}: image id {image['id']} does not fit in int32, as DALI reads ids: "
                f"renumber the images"
            )
        if Path(image["file_name"]).suffix.lower().lstrip(".") not in IMAGE.split(";"):
            raise HydraliError(
                f"{part.annotation_file}: image id {image['id']} ({image['file_name']}) is not named as an image file "
                f"({IMAGE.replace(';', ', ')}): rename it, as the shards store it under its extension"
            )
    if seed is not None:
        random.Random(seed).shuffle(images)

    def each() -> Iterator[dict]:
        for number, image in enumerate(images):
            path = part.images_dir / image["file_name"]
            boxes, labels = _boxes_and_labels(boxes_of[image["id"]], image, labels_of)
            yield {
                webdataset.KEY: f"{number:08d}",
                path.suffix.lower().lstrip("."): path.read_bytes(),
                BOXES: boxes,
                LABELS: labels,
                IMAGE_ID: np.array([image["id"]], dtype="<i4").tobytes(),
            }

    return len(images), each()


def facts(dataset: CocoInfo) -> dict:
    """What the manifest records about a detection dataset: its categories (ids and names, in label order), where
    the val annotation file is, and the boxes and images of each split."""
    train_images = load_coco_json(dataset.train.annotation_file)
    with_boxes = {a["image_id"] for a in train_images["annotations"]}
    return {
        "categories": [{"id": i, "name": n} for i, n in zip(dataset.category_ids, dataset.category_names)],
        "val_annotations": VAL_ANNOTATIONS,
        "train_boxes": dataset.train.num_boxes,
        "val_boxes": dataset.val.num_boxes,
        "train_images_without_boxes": sum(1 for image in train_images["images"] if image["id"] not in with_boxes),
    }


def files(dataset: CocoInfo) -> dict[str, bytes]:
    """The files the shards' folder holds besides the tars: the val split's annotation file (the cleaned one, whose
    images and boxes the val shards hold)."""
    return {VAL_ANNOTATIONS: Path(dataset.val.annotation_file).read_bytes()}
