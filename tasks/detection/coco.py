"""Checks of a COCO-format dataset, the bundled one or any user's, before DALI's `fn.readers.coco` reads it.

COCO's layout, which is what DALI's reader reads:

    <root>/train2017/*.jpg   <root>/val2017/*.jpg
    <root>/annotations/instances_train2017.json   <root>/annotations/instances_val2017.json

(the folder names are settings; an annotation file is named `instances_<images folder>.json`).

Labels. COCO files number their categories freely (COCO itself uses 1..90 with gaps). DALI's reader
renumbers them 1..K (0 is left for the background) in the order the `categories` list of the file gives
them, which for COCO's own files is the sorted order. `scan_coco` makes that order the sorted one for
every file (a file listing its categories out of order is read through a cleaned copy), so that
`contiguous_labels(ids)` (file id -> label) is exactly DALI's mapping; predictions are mapped back
(label -> file id) by hydrali.tasks.detection.evaluation.category_ids_of, from the file DALI reads.
Fixable problems (boxes partly outside their image, boxes of no area) are fixed in that cleaned copy,
with a logged count; the others end in one line naming the file.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from hydrali.core.errors import HydraliError
from hydrali.core.files import write_atomically

log = logging.getLogger("hydrali")


def annotation_file_name(images_dir: str) -> str:
    """The name COCO gives the annotation file of an image folder: instances_<folder>.json."""
    return f"instances_{images_dir}.json"


def default_annotations(images_dir: str, annotations_dir: str = "annotations") -> str:
    """The annotation file of an image folder, relative to the dataset root, in COCO's layout."""
    return f"{annotations_dir}/{annotation_file_name(images_dir)}"


MIN_BOX_SIDE = 0.1  # DALI's readers.coco ignores boxes thinner than this (its size_threshold): such boxes are dropped
CLEAN_FORMAT = 1  # bump when cleaning changes: cleaned copies made by older code are then made again
MAX_IDS_SHOWN = 12  # ids named in one error message at most


@dataclass(frozen=True)
class CocoSplit:
    """One split of a COCO dataset: its image folder, the annotation file DALI reads, its counts and categories.

    `annotation_file` is the user's file, or the cleaned copy written when something had to be fixed.
    `num_boxes` counts the boxes DALI reads (crowd boxes included).
    """

    images_dir: Path
    annotation_file: Path
    num_images: int
    num_boxes: int
    category_ids: tuple[int, ...]
    category_names: tuple[str, ...]


class DetectionDataset:
    """What every detection dataset (image folders: CocoInfo; shards: sharded.ShardedDetection) tells of its
    categories and figures, from the attributes below that each kind holds."""

    val: CocoSplit  # it names the categories: every split has the same ones
    num_train: int
    num_val: int
    train_boxes: int

    @property
    def classes(self) -> tuple[str, ...]:
        """The category names, in label order (label k is classes[k - 1])."""
        return self.val.category_names

    @property
    def num_classes(self) -> int:
        """The number of categories (without the background)."""
        return len(self.val.category_ids)

    @property
    def category_ids(self) -> tuple[int, ...]:
        """The categories' ids in the files, sorted: label k (1..K) is category_ids[k - 1]."""
        return self.val.category_ids

    @property
    def category_names(self) -> tuple[str, ...]:
        """The categories' names, in the order of category_ids."""
        return self.val.category_names

    def params(self) -> dict:
        """What is logged to MLflow about the data: its categories, images and boxes."""
        return {
            "dataset/num_classes": self.num_classes,
            "dataset/num_train": self.num_train,
            "dataset/num_val": self.num_val,
            "dataset/train_boxes": self.train_boxes,
            "dataset/val_boxes": self.val.num_boxes,
        }


@dataclass(frozen=True)
class CocoInfo(DetectionDataset):
    """A checked COCO dataset: its root and its train and val splits (which have the same categories)."""

    root: Path
    train: CocoSplit
    val: CocoSplit
    skipped: tuple[tuple[Path, str], ...] = ()  # bad image files left out (data.bad_files=skip), with why

    def without(self, bad: list[tuple[Path, str]], clean_dir: str | os.PathLike) -> CocoInfo:
        """This dataset with the images of `bad` left out, with their boxes: each split that held one reads a copy
        of its annotation file without them, written under `clean_dir`/<split>/."""
        gone = {path for path, _ in bad}
        train, val = (
            without_images(split, gone, Path(clean_dir) / name / f"{split.annotation_file.stem}.without_bad_files.json")
            for name, split in (("train", self.train), ("val", self.val))
        )
        return replace(self, train=train, val=val, skipped=tuple(bad))

    @property
    def num_train(self) -> int:
        """The number of training images."""
        return self.train.num_images

    @property
    def num_val(self) -> int:
        """The number of validation images."""
        return self.val.num_images

    @property
    def train_boxes(self) -> int:
        """The number of boxes of the training images."""
        return self.train.num_boxes


def contiguous_labels(category_ids: Iterable[int]) -> dict[int, int]:
    """File category id -> label 1..K (0 is the background), by sorted id: DALI readers.coco's labels."""
    return {cid: label for label, cid in enumerate(sorted(category_ids), start=1)}


def _shown(ids: Iterable) -> str:
    """At most MAX_IDS_SHOWN ids, comma separated, with '...' when there are more."""
    ids = list(ids)
    return ", ".join(map(str, ids[:MAX_IDS_SHOWN])) + (", ..." if len(ids) > MAX_IDS_SHOWN else "")


def load_coco_json(annotation_file: Path) -> dict:
    """The parsed annotation file: an object with `images`, `annotations` and `categories` lists, or an error."""
    if not annotation_file.is_file():
        raise HydraliError(
            f"{annotation_file} is missing: put the COCO annotation file there or point "
            f"the data config's annotation path at it"
        )
    text = annotation_file.read_bytes()
    if not text.strip():
        raise HydraliError(f"{annotation_file} is empty: replace it with the COCO annotation file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise HydraliError(
            f"{annotation_file} is not valid JSON (line {err.lineno}, column {err.colno}: "
            f"{err.msg}): fix or replace the file"
        ) from None
    except UnicodeDecodeError:
        raise HydraliError(
            f"{annotation_file} is not JSON text (it is not UTF-8): replace it with the COCO annotation file"
        ) from None
    for key in ("images", "annotations", "categories"):
        if not isinstance(data, dict) or not isinstance(data.get(key), list):
            raise HydraliError(
                f"{annotation_file} has no `{key}` list: a COCO annotation file is a JSON object "
                f"with `images`, `annotations` and `categories` lists"
            )
    return data


def _is_number(value) -> bool:
    """Whether `value` is a JSON number (not a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _categories(data: dict, annotation_file: Path) -> dict[int, str]:
    """The file's categories, id -> name, checked: integer ids, no id twice, at least one."""
    categories: dict[int, str] = {}
    for entry in data["categories"]:
        cid = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(cid, int) or isinstance(cid, bool):
            raise HydraliError(
                f"{annotation_file}: category {str(entry)[:80]} has no integer `id`: give every category one"
            )
        if cid in categories:
            raise HydraliError(f"{annotation_file}: category id {cid} is listed twice: give each category its own id")
        categories[cid] = str(entry.get("name", cid))
    if not categories:
        raise HydraliError(f"{annotation_file} lists no categories: add the `categories` of its boxes")
    return categories


def _images(data: dict, annotation_file: Path) -> dict[int, dict]:
    """The file's images, id -> entry, checked: an id, a file name, a width and height in pixels, no id twice."""
    images: dict[int, dict] = {}
    for entry in data["images"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str) or "id" not in entry:
            raise HydraliError(
                f"{annotation_file}: image {str(entry)[:80]} has no `id` or `file_name`: give every image both"
            )
        name = f"image id={entry['id']!r} ({entry['file_name']})"
        if not isinstance(entry["id"], int) or isinstance(entry["id"], bool):
            raise HydraliError(f"{annotation_file}: {name} has an `id` that is not an integer: number the images")
        if not all(_is_number(entry.get(k)) and entry[k] > 0 for k in ("width", "height")):
            raise HydraliError(
                f"{annotation_file}: {name} has no positive `width` and `height`: add its size in pixels to the file"
            )
        if entry["id"] in images:
            raise HydraliError(f"{annotation_file}: image id {entry['id']} is listed twice: give each image its own id")
        images[entry["id"]] = entry
    if not images:
        raise HydraliError(f"{annotation_file} lists no images: add the `images` of this split")
    return images


def _check_image_files(images_dir: Path, images: dict[int, dict], annotation_file: Path) -> None:
    """Fail, naming the first, when image files listed in the annotation file are not in `images_dir`."""
    present = {entry.name for entry in os.scandir(images_dir)}  # one listing, not a look-up per image

    def on_disk(name: str) -> bool:
        return name in present or ("/" in name and (images_dir / name).is_file())

    missing = [e["file_name"] for e in images.values() if not on_disk(e["file_name"])]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise HydraliError(
            f"{images_dir / missing[0]}{more}, listed in {annotation_file}, is missing: put the "
            f"images in {images_dir} or remove them from the annotation file"
        )


@dataclass
class _Fixes:
    """What cleaning changed in one annotation file."""

    clipped: int = 0
    dropped: int = 0
    no_area: int = 0
    categories_sorted: bool = False

    def any(self) -> bool:
        """Whether anything was changed."""
        return bool(self.clipped or self.dropped or self.no_area or self.categories_sorted)

    def describe(self) -> str:
        """What was changed, in words."""
        parts = [
            f"clipped {self.clipped} box(es) partly outside their image to it" if self.clipped else "",
            f"dropped {self.dropped} box(es) of zero area (a side under {MIN_BOX_SIDE} px once clipped)"
            if self.dropped
            else "",
            f"gave {self.no_area} box(es) without `area` their box's area" if self.no_area else "",
            "sorted the categories by id (DALI numbers labels in the file's order)" if self.categories_sorted else "",
        ]
        return ", ".join(p for p in parts if p)


def _checked_box(annotation: dict, annotation_file: Path) -> list[float]:
    """The annotation's [x, y, w, h], checked to be four numbers."""
    box = annotation.get("bbox")
    if not (isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box)):
        raise HydraliError(
            f"{annotation_file}: annotation id={annotation.get('id')} has bbox={box!r}: "
            f"it must be [x, y, width, height] in pixels"
        )
    return box


def _clipped(box: list[float], width: float, height: float) -> list[float]:
    """[x, y, w, h] cut to the image (w or h may end up zero or negative); `box` itself when inside it."""
    if box[0] >= 0 and box[1] >= 0 and box[0] + box[2] <= width and box[1] + box[3] <= height:
        return box
    x0, y0 = max(box[0], 0), max(box[1], 0)
    x1, y1 = min(box[0] + box[2], width), min(box[1] + box[3], height)
    return [x0, y0, x1 - x0, y1 - y0]


def _image_of(annotation, images: dict[int, dict], categories: dict[int, str], annotation_file: Path) -> dict:
    """The image entry of an annotation, checked to be an object of a listed image and a listed category."""
    if not isinstance(annotation, dict):
        raise HydraliError(f"{annotation_file}: annotation {str(annotation)[:80]} is not an object: fix the file")
    image = images.get(annotation.get("image_id"))
    if image is None:
        raise HydraliError(
            f"{annotation_file}: annotation id={annotation.get('id')} has image_id="
            f"{annotation.get('image_id')!r}, which is not among the file's images: "
            f"fix its image_id or remove it"
        )
    if annotation.get("category_id") not in categories:
        raise HydraliError(
            f"{annotation_file}: annotation id={annotation.get('id')} has category_id="
            f"{annotation.get('category_id')!r}, not one of the file's category ids "
            f"({_shown(sorted(categories))}): fix it or add the category"
        )
    return image


def _fixed(annotation: dict, image: dict, fixes: _Fixes, annotation_file: Path) -> dict | None:
    """The annotation with its box clipped to its image (and an area), or None when nothing of the box is left."""
    box = _checked_box(annotation, annotation_file)
    clipped = _clipped(box, image["width"], image["height"])
    if clipped[2] < MIN_BOX_SIDE or clipped[3] < MIN_BOX_SIDE:
        fixes.dropped += 1
        return None
    if clipped is not box:
        fixes.clipped += 1
        annotation = {**annotation, "bbox": clipped}
        if _is_number(annotation.get("area")):  # what is left of the object cannot exceed its clipped box
            annotation["area"] = min(annotation["area"], clipped[2] * clipped[3])
    if not _is_number(annotation.get("area")):  # COCO's evaluation needs an area (it sorts boxes into sizes by it)
        fixes.no_area += 1
        annotation = {**annotation, "area": clipped[2] * clipped[3]}
    return annotation


def _clean_annotations(
    data: dict, images: dict[int, dict], categories: dict[int, str], annotation_file: Path
) -> tuple[list[dict], _Fixes]:
    """The annotations checked (known image and category, a box) and cleaned (clipped, degenerate boxes dropped)."""
    fixes, kept = _Fixes(), []
    for annotation in data["annotations"]:
        image = _image_of(annotation, images, categories, annotation_file)
        fixed = _fixed(annotation, image, fixes, annotation_file)
        if fixed is not None:
            kept.append(fixed)
    return kept, fixes


def without_images(split: CocoSplit, files: set[Path], clean_file: Path) -> CocoSplit:
    """`split` without the images whose files are among `files`, nor their boxes: read through a copy of its
    annotation file written to `clean_file`; `split` itself when it holds none of them."""
    data = load_coco_json(split.annotation_file)
    gone = {image["id"] for image in data["images"] if split.images_dir / image["file_name"] in files}
    if not gone:
        return split
    if len(gone) == len(data["images"]):
        raise HydraliError(f"every image of {split.images_dir} cannot be decoded: nothing is left to read")
    data = {
        **data,
        "images": [image for image in data["images"] if image["id"] not in gone],
        "annotations": [a for a in data["annotations"] if a["image_id"] not in gone],
    }
    _write_json(clean_file, data)
    return replace(
        split, annotation_file=clean_file, num_images=len(data["images"]), num_boxes=len(data["annotations"])
    )


def _write_json(path: Path, content) -> None:
    """Write `content` as JSON to `path` atomically (a reader sees the old file or the new one, whole)."""
    write_atomically(path, json.dumps(content, separators=(",", ":")).encode())


def _write_clean_copy(data: dict, target: Path, source: Path) -> None:
    """Write `data` as JSON to `target` atomically, unless a copy made from this very `source` is already there."""
    stat = source.stat()
    stamp = {
        "source": str(source.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "format": CLEAN_FORMAT,
    }
    stamp_file = target.with_name(target.name + ".source.json")
    try:
        if target.is_file() and json.loads(stamp_file.read_text()) == stamp:
            return
    except (OSError, ValueError):
        pass  # no usable stamp: write the copy again
    for path, content in ((target, data), (stamp_file, stamp)):
        _write_json(path, content)


def scan_coco_split(
    images_dir: Path, annotation_file: Path, clean_file: Path, pending: list | None = None
) -> CocoSplit:
    """Check one split (its image folder and annotation file) and count it; fix what can be fixed.

    Boxes partly outside their image are clipped to it; boxes of zero area once clipped (a side under
    MIN_BOX_SIDE pixels) are dropped; boxes without `area` get their box's; categories listed out of id
    order are sorted. When anything was fixed, the cleaned file is written to `clean_file` (or, with `pending`,
    its writing is appended there, for the caller to do once every check has passed), the counts are logged (one
    warning line) and the split reads the cleaned file. Images without boxes are kept.
    """
    if not images_dir.is_dir():
        raise HydraliError(
            f"{images_dir} is missing: put the split's images there or point the data config at their folder"
        )
    data = load_coco_json(annotation_file)
    categories = _categories(data, annotation_file)
    images = _images(data, annotation_file)
    _check_image_files(images_dir, images, annotation_file)
    annotations, fixes = _clean_annotations(data, images, categories, annotation_file)
    ids = tuple(sorted(categories))
    fixes.categories_sorted = tuple(categories) != ids
    if fixes.any():
        cleaned = {**data, "annotations": annotations, "categories": sorted(data["categories"], key=lambda c: c["id"])}
        write = (cleaned, clean_file, annotation_file)
        if pending is not None:
            pending.append(write)
        else:
            _write_clean_copy(*write)
        log.warning("%s: %s; reading the cleaned copy %s", annotation_file, fixes.describe(), clean_file)
        annotation_file = clean_file
    return CocoSplit(images_dir, annotation_file, len(images), len(annotations), ids, tuple(categories[i] for i in ids))


def _category_difference(train: CocoSplit, val: CocoSplit) -> str:
    """The categories that differ between two splits, in words."""
    train_set = set(zip(train.category_ids, train.category_names))
    val_set = set(zip(val.category_ids, val.category_names))
    only_train = ", ".join(f"{i} ({n})" for i, n in sorted(train_set - val_set)[:MAX_IDS_SHOWN])
    only_val = ", ".join(f"{i} ({n})" for i, n in sorted(val_set - train_set)[:MAX_IDS_SHOWN])
    return f"only in train: {only_train or 'none'}; only in val: {only_val or 'none'}"


def scan_coco(
    root: str | os.PathLike,
    *,
    train_dir: str = "train2017",
    val_dir: str = "val2017",
    train_annotations: str | os.PathLike | None = None,
    val_annotations: str | os.PathLike | None = None,
    clean_dir: str | os.PathLike,
) -> CocoInfo:
    """Check a COCO dataset under `root` and count it: every problem a user must fix is a one-line HydraliError.

    `train_dir`/`val_dir` are the image folders, `train_annotations`/`val_annotations` the annotation
    files (relative to `root` unless absolute; by default annotations/instances_<folder>.json). What can
    be fixed is fixed in a cleaned copy under `clean_dir`/train/ or `clean_dir`/val/ (see
    scan_coco_split). Both splits must have the same categories.
    """
    root = Path(root)
    if not root.is_dir():
        raise HydraliError(
            f"data.root={root} does not exist: point data.root at a COCO folder holding "
            f"{train_dir}/, {val_dir}/ and the annotation files"
        )
    splits, pending = {}, []  # the cleaned copies are written once both splits passed their checks
    for split, images_dir, given in (("train", train_dir, train_annotations), ("val", val_dir, val_annotations)):
        annotation_file = root / (given if given is not None else default_annotations(images_dir))
        splits[split] = scan_coco_split(
            root / images_dir, annotation_file, Path(clean_dir) / split / annotation_file.name, pending
        )
    train, val = splits["train"], splits["val"]
    if (train.category_ids, train.category_names) != (val.category_ids, val.category_names):
        raise HydraliError(
            f"{train.annotation_file} and {val.annotation_file} have different categories "
            f"({_category_difference(train, val)}): give both files the same categories"
        )
    for write in pending:
        _write_clean_copy(*write)
    return CocoInfo(root, train, val)


EXIF_ORIENTATION = 0x0112  # the EXIF tag of how a camera held the picture
TURNED = (5, 6, 7, 8)  # its values for a picture turned a quarter: width and height swap once upright


def images_only_coco(folder: Path, files: list[str], categories_from: Path) -> dict:
    """A COCO annotation file of `files` (relative to `folder`) without boxes: ids 1.. in their order, their sizes
    (read from their headers), and the categories of `categories_from` (hydrali predict reads new images so)."""
    from PIL import Image

    images = []
    for number, name in enumerate(files, start=1):
        with Image.open(folder / name) as picture:
            width, height = picture.size
            if picture.getexif().get(EXIF_ORIENTATION) in TURNED:  # DALI's decoder turns such images upright
                width, height = height, width
        images.append({"id": number, "file_name": name, "width": width, "height": height})
    return {"images": images, "annotations": [], "categories": load_coco_json(categories_from)["categories"]}
