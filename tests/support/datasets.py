"""The datasets tests write.

One image per class (`write_one_image_per_class`): an image folder where a label names its file, so that the labels
a process trained on tell which files DALI read for it.

A small COCO-layout set (`write_rectangles_coco`): solid rectangles (the objects) on a plain light background, so
that a test can find each object's pixels; non-square images of several sizes, category ids 3/7/11 (not 1..K), and
one validation image without any box."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

CATEGORIES = [{"id": 3, "name": "red"}, {"id": 7, "name": "green"}, {"id": 11, "name": "blue"}]
COLOURS = {3: (170, 20, 20), 7: (20, 150, 20), 11: (20, 20, 170)}  # dark, saturated: far from the background
CANVAS_COLOUR = (235, 235, 235)
SIZES = [(160, 120), (120, 160), (200, 100), (128, 128)]  # (width, height), cycled
EMPTY_VAL_IMAGE = 1000  # the id of the val image without boxes


def _boxes(rng, width: int, height: int, count: int) -> list[list[int]]:
    """Up to `count` non-overlapping pixel boxes [x, y, w, h] of sides 18..45% of the image."""
    boxes = []
    for _ in range(50):
        if len(boxes) == count:
            break
        w, h = (int(rng.integers(int(0.18 * s), int(0.45 * s))) for s in (width, height))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        if all(x + w + 2 <= bx or bx + bw + 2 <= x or y + h + 2 <= by or by + bh + 2 <= y for bx, by, bw, bh in boxes):
            boxes.append([x, y, w, h])
    return boxes


def _write_split(root: Path, folder: str, count: int, first_id: int, rng, empty_id: int | None) -> dict:
    images, annotations = [], []
    (root / folder).mkdir(parents=True, exist_ok=True)
    ids = [first_id + i for i in range(count)] + ([empty_id] if empty_id is not None else [])
    for n, image_id in enumerate(ids):
        width, height = SIZES[n % len(SIZES)]
        pixels = np.full((height, width, 3), CANVAS_COLOUR, dtype=np.uint8)
        boxes = [] if image_id == empty_id else _boxes(rng, width, height, int(rng.integers(1, 4)))
        for box in boxes:
            x, y, w, h = box
            category = CATEGORIES[int(rng.integers(0, len(CATEGORIES)))]["id"]
            pixels[y : y + h, x : x + w] = COLOURS[category]
            annotations.append(
                {
                    "id": len(annotations) + first_id * 10,
                    "image_id": image_id,
                    "category_id": category,
                    "bbox": box,
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
        name = f"{image_id:06d}.jpg"
        Image.fromarray(pixels).save(root / folder / name, quality=95)
        images.append({"id": image_id, "file_name": name, "width": width, "height": height})
    return {"images": images, "annotations": annotations, "categories": CATEGORIES}


def write_rectangles_coco(root: Path, *, num_train: int = 24, num_val: int = 8, seed: int = 0) -> Path:
    """Write the set under `root` in COCO's layout (train2017/, val2017/, annotations/); return `root`.
    The last validation image (id EMPTY_VAL_IMAGE) has no boxes."""
    rng = np.random.default_rng(seed)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    for folder, count, first_id, empty in (
        ("train2017", num_train, 1, None),
        ("val2017", num_val - 1, 500, EMPTY_VAL_IMAGE),
    ):
        data = _write_split(root, folder, count, first_id, rng, empty)
        (root / "annotations" / f"instances_{folder}.json").write_text(json.dumps(data))
    return root


def write_one_image_per_class(root: Path, classes: int, size: int = 24) -> None:
    """An image folder (train/ and val/) where every image is its own class: a label names its file."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"c{c:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / "0.jpg", quality=90)


def copy_as_a_users_coco(source: Path, root: Path, first_id: int = 11, step: int = 3) -> Path:
    """A copy of a COCO-layout set (images and annotation files) under `root` as a user would bring it: the
    category ids renumbered first_id, first_id + step, ... (not 1..K) and renamed, the list in reverse order;
    return `root`."""
    import shutil

    for folder in ("train2017", "val2017"):
        shutil.copytree(source / folder, root / folder)
        coco = json.loads((source / "annotations" / f"instances_{folder}.json").read_text())
        new_id = {c["id"]: first_id + step * n for n, c in enumerate(coco["categories"])}
        coco["categories"] = [{"id": new_id[c["id"]], "name": f"digit {c['name']}"} for c in coco["categories"]][::-1]
        for annotation in coco["annotations"]:
            annotation["category_id"] = new_id[annotation["category_id"]]
        (root / "annotations").mkdir(parents=True, exist_ok=True)
        (root / "annotations" / f"instances_{folder}.json").write_text(json.dumps(coco))
    return root
