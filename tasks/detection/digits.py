"""The bundled detection data, `data=digits_detection`: scikit-learn's real digit scans composited onto
textured canvases, written once as JPEG files with COCO-format annotations in COCO's layout
(see hydrali.tasks.detection.coco), deterministic from a seed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hydrali.core.errors import HydraliError
from hydrali.tasks.detection.coco import annotation_file_name

log = logging.getLogger("hydrali")


DIGITS_MARKER = "hydrali-detection-digits.json"
DIGITS_FORMAT = 1  # bump when the drawing changes: a folder written by older code is then refused
DIGITS_SPLIT_SEED = 0  # the scans' train/val split is fixed: the same scans on every machine
DIGITS_VAL_FRACTION = 0.25  # share of the 1,797 scans kept for validation images (stratified by digit)
DIGITS_JPEG_QUALITY = 90
SPLIT_STREAMS = {"train": 0, "val": 1}  # the random stream of image i of a split is (seed, stream, i)
SCAN_SIZE = 8  # scikit-learn's digit scans are 8x8 ...
SCAN_FULL_INK = 16.0  # ... with values 0 (paper) to 16 (full ink)
INK_THRESHOLD = 0.1  # an upscaled scan pixel is drawn when above this share of full ink, else left out
MAX_OVERLAP_IOU = 0.1  # a digit whose box overlaps an earlier one by more IoU is placed elsewhere ...
PLACEMENT_TRIES = 20  # ... up to this many times, then left out of the image
FIELD_GRID = 4  # the colour field behind the digits: a GRID x GRID x RGB random grid, smoothly upscaled
FIELD_LEVELS = (45.0, 210.0)  # grey levels of the field's grid points: never paper-white nor ink-black
FIELD_NOISE = 8.0  # standard deviation (grey levels) of the pixel grain on the field: texture
LIGHT_INK = (215, 256)  # grey levels of a digit drawn on a dark patch (per channel, upper bound excluded)
DARK_INK = (0, 41)  # grey levels of a digit drawn on a light patch
MID_GREY = 127.5  # a patch darker than this gets light ink, a lighter one dark ink
DIGIT_CATEGORIES = tuple({"id": d + 1, "name": str(d), "supercategory": "digit"} for d in range(10))
DIGITS_FILE = "datasets/data/digits.csv.gz"  # where scikit-learn keeps its digit scans, inside its package
SCAN_KEY = "scan_index"  # extra key of a digits annotation: the index of its scan in load_digits()
WRITE_THREADS = 8  # images drawn and encoded at once at most (resizing and JPEG encoding release the GIL)


@dataclass(frozen=True)
class DrawnDigit:
    """One digit drawn on a canvas: its category id, the scan it came from, its ink's tight box [x, y, w, h]."""

    category_id: int
    scan_index: int
    bbox: tuple[int, int, int, int]


@dataclass(frozen=True)
class DigitsCanvas:
    """One bundled image before JPEG encoding: the background alone, the image with its digits, the digits."""

    background: Any  # uint8 array, canvas x canvas x 3
    image: Any  # uint8 array, canvas x canvas x 3
    digits: tuple[DrawnDigit, ...]


def _digit_scans():
    """scikit-learn's digit scans (n x 8 x 8, float32) and their digits, as load_digits() gives them.

    Read straight from the file scikit-learn ships (digits.csv.gz), which spares importing scikit-learn
    (seconds of CPU); load_digits() itself is used when that file is not where it has always been.
    """
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    folders = (spec.submodule_search_locations or []) if spec else []
    shipped = [Path(folder) / DIGITS_FILE for folder in folders if (Path(folder) / DIGITS_FILE).is_file()]
    if shipped:
        table = np.loadtxt(shipped[0], delimiter=",", dtype=np.float32)
        return table[:, :-1].reshape(-1, SCAN_SIZE, SCAN_SIZE), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images.astype(np.float32), digits.target.astype(np.int64)


def _stratified_split(targets) -> dict:
    """The fixed split of scan indices: DIGITS_VAL_FRACTION of each digit's scans for val, the rest for train."""
    import numpy as np

    rng = np.random.default_rng(DIGITS_SPLIT_SEED)
    val = []
    for digit in np.unique(targets):
        members = rng.permutation(np.nonzero(targets == digit)[0])
        val.extend(members[: round(len(members) * DIGITS_VAL_FRACTION)])
    val = np.sort(np.array(val))
    return {"train": np.setdiff1d(np.arange(len(targets)), val), "val": val}


@lru_cache(maxsize=1)
def _scans_and_split():
    """The digit scans, their digits, and the fixed train/val split of their indices."""
    scans, targets = _digit_scans()
    return scans, targets, _stratified_split(targets)


def _colour_field(rng, canvas: int):
    """A smooth random colour field with pixel noise: uint8, canvas x canvas x 3."""
    import numpy as np
    from PIL import Image

    grid = rng.uniform(*FIELD_LEVELS, (FIELD_GRID, FIELD_GRID, 3)).round().astype(np.uint8)
    field_ = np.asarray(Image.fromarray(grid).resize((canvas, canvas), Image.Resampling.BICUBIC), np.float32)
    noise = rng.standard_normal((canvas, canvas, 1), dtype=np.float32)  # grey grain, the same on every channel
    noisy = field_ + noise * np.float32(FIELD_NOISE)
    return np.clip(noisy, 0, 255, out=noisy).round(out=noisy).astype(np.uint8)


def _ink(scan, size: int):
    """The scan upscaled to size x size as ink coverage in [0, 1], zero wherever it is not drawn."""
    import numpy as np
    from PIL import Image

    upscaled = np.asarray(Image.fromarray(scan).resize((size, size), Image.Resampling.BICUBIC))  # float32: mode F
    coverage = np.clip(upscaled / SCAN_FULL_INK, 0.0, 1.0)
    coverage[coverage <= INK_THRESHOLD] = 0.0
    return coverage


def _tight_box(coverage) -> tuple[int, int, int, int]:
    """The smallest box [x0, y0, x1, y1) holding every drawn pixel of `coverage`."""
    import numpy as np

    rows, cols = np.nonzero(coverage.any(axis=1))[0], np.nonzero(coverage.any(axis=0))[0]
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def box_iou(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    """Intersection over union of two [x, y, w, h] boxes."""
    iw = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def _place(rng, width: int, height: int, canvas: int, taken: list) -> tuple[int, int] | None:
    """A random top-left corner for a width x height box inside the canvas that barely overlaps `taken`, or None."""
    for _ in range(PLACEMENT_TRIES):
        x, y = int(rng.integers(0, canvas - width + 1)), int(rng.integers(0, canvas - height + 1))
        if all(box_iou((x, y, width, height), box) <= MAX_OVERLAP_IOU for box in taken):
            return x, y
    return None


def _ink_colour(rng, patch):
    """A colour that stands out from `patch`: light ink on a dark patch, dark ink on a light one."""
    import numpy as np

    levels = LIGHT_INK if patch.mean() < MID_GREY else DARK_INK
    return rng.integers(*levels, 3).astype(np.float32)


def _draw(image, coverage, colour, x: int, y: int) -> None:
    """Blend `colour` into the float image at (x, y) with `coverage` as opacity."""
    h, w = coverage.shape
    region = image[y : y + h, x : x + w]
    alpha = coverage[..., None]
    image[y : y + h, x : x + w] = region * (1.0 - alpha) + colour * alpha


def render_digits_image(
    split: str, index: int, *, seed: int, canvas: int, min_digits: int, max_digits: int, min_size: int, max_size: int
) -> DigitsCanvas:
    """Image `index` (0-based) of the bundled digits' `split` ("train" or "val"): what write_digits_detection writes.

    Every image has its own random stream, (seed, split, index), so an image does not depend on the
    others. Digits come from the split's own scans; a digit that finds no free place is left out.
    """
    import numpy as np

    scans, targets, pools = _scans_and_split()
    pool = pools[split]
    rng = np.random.default_rng([seed, SPLIT_STREAMS[split], index])
    background = _colour_field(rng, canvas)
    image = background.astype(np.float32)
    digits: list[DrawnDigit] = []
    for _ in range(int(rng.integers(min_digits, max_digits + 1))):
        scan_index = int(pool[rng.integers(len(pool))])
        coverage = _ink(scans[scan_index], int(rng.integers(min_size, max_size + 1)))
        x0, y0, x1, y1 = _tight_box(coverage)
        ink = coverage[y0:y1, x0:x1]
        h, w = ink.shape
        corner = _place(rng, w, h, canvas, [d.bbox for d in digits])
        if corner is None:
            continue
        x, y = corner
        _draw(image, ink, _ink_colour(rng, image[y : y + h, x : x + w]), x, y)
        digits.append(DrawnDigit(int(targets[scan_index]) + 1, scan_index, (x, y, w, h)))
    return DigitsCanvas(background, np.clip(image.round(), 0, 255).astype(np.uint8), tuple(digits))


def _check_digits_settings(settings: dict) -> None:
    """Fail, naming the key, on settings that cannot make a dataset."""
    for key in ("num_train", "num_val", "min_digits"):
        if settings[key] < 1:
            raise HydraliError(f"data.{key}={settings[key]}: it must be 1 or more")
    if settings["seed"] < 0:
        raise HydraliError(f"seed={settings['seed']}: the bundled detection digits need a seed of 0 or more")
    if settings["max_digits"] < settings["min_digits"]:
        raise HydraliError(
            f"data.max_digits={settings['max_digits']} is below data.min_digits="
            f"{settings['min_digits']}: raise max_digits or lower min_digits"
        )
    if not SCAN_SIZE <= settings["min_size"] <= settings["max_size"] <= settings["canvas"]:
        raise HydraliError(
            f"data.min_size={settings['min_size']}, data.max_size={settings['max_size']}, "
            f"data.canvas={settings['canvas']}: need {SCAN_SIZE} <= min_size <= max_size <= canvas"
        )
    if len({settings["train_dir"], settings["val_dir"], settings["annotations_dir"]}) < 3:
        raise HydraliError(
            f"data.train_dir, data.val_dir and data.annotations_dir must differ, not "
            f"{settings['train_dir']}, {settings['val_dir']}, {settings['annotations_dir']}"
        )


def _digits_written(root: Path, settings: dict) -> bool:
    """Whether `root` already holds the digits written with `settings` (an error if with other settings)."""
    marker = root / DIGITS_MARKER
    if not marker.exists():
        return False
    written = json.loads(marker.read_text())
    if written != settings:
        changed = sorted(k for k in settings.keys() | written.keys() if settings.get(k) != written.get(k))
        raise HydraliError(
            f"{root} holds detection digits written with other settings ("
            + ", ".join(f"{k}={written.get(k)} there, {settings.get(k)} now" for k in changed)
            + f"): delete {root} or set data.root to another folder"
        )
    return True


def _coco_document(images: list[dict], annotations: list[dict]) -> dict:
    """A COCO instances file of the digits."""
    return {
        "info": {"description": "hydrali bundled digits: scikit-learn digit scans on textured canvases"},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": list(DIGIT_CATEGORIES),
    }


def _write_digits_image(folder: Path, split: str, index: int, draw: dict) -> tuple[dict, list[dict]]:
    """Draw image `index` of `split`, write it as a JPEG file into `folder`; return its COCO image entry and boxes."""
    from PIL import Image

    drawn = render_digits_image(split, index, **draw)
    image_id = index + 1
    file_name = f"{image_id:06d}.jpg"
    Image.fromarray(drawn.image).save(folder / file_name, quality=DIGITS_JPEG_QUALITY)
    entry = {"id": image_id, "file_name": file_name, "width": draw["canvas"], "height": draw["canvas"]}
    boxes = [
        {
            "image_id": image_id,
            "category_id": d.category_id,
            "bbox": list(d.bbox),
            "area": d.bbox[2] * d.bbox[3],
            "iscrowd": 0,
            SCAN_KEY: d.scan_index,
        }
        for d in drawn.digits
    ]
    return entry, boxes


def _write_digits_split(folder: Path, annotation_file: Path, split: str, count: int, settings: dict) -> None:
    """Write `count` images of `split` into `folder` and their annotations into `annotation_file`."""
    folder.mkdir(parents=True)
    draw = {k: settings[k] for k in ("seed", "canvas", "min_digits", "max_digits", "min_size", "max_size")}
    _scans_and_split()  # loaded once, before the threads need it
    with ThreadPoolExecutor(min(WRITE_THREADS, os.cpu_count() or 1)) as pool:
        written = list(pool.map(lambda index: _write_digits_image(folder, split, index, draw), range(count)))
    images = [entry for entry, _ in written]
    annotations = [{"id": number, **box} for number, box in enumerate((b for _, boxes in written for b in boxes), 1)]
    annotation_file.write_text(json.dumps(_coco_document(images, annotations)))


def write_digits_detection(
    root: str | os.PathLike,
    *,
    num_train: int,
    num_val: int,
    canvas: int,
    min_digits: int,
    max_digits: int,
    min_size: int,
    max_size: int,
    seed: int,
    train_dir: str = "train2017",
    val_dir: str = "val2017",
    annotations_dir: str = "annotations",
) -> Path:
    """Write the bundled detection digits once under `root`, in COCO's layout; return `root`.

    Each image is a canvas x canvas RGB JPEG of min_digits..max_digits scikit-learn digit scans, each
    upscaled to min_size..max_size pixels, on a textured background; a digit's box is the tight box of
    its drawn ink, category ids 1..10 are the digits "0".."9", and each annotation also names its scan
    (`scan_index`). Train and val images draw from disjoint scans. The annotation files are
    <root>/<annotations_dir>/instances_<train_dir>.json and instances_<val_dir>.json. The same settings
    give the same bytes (on the same library versions). Writing goes to a temporary folder renamed
    into place, so several processes may call this at once and a half-written dataset is never read;
    a folder written with other settings is an error.
    """
    root = Path(root)
    settings = {
        "format": DIGITS_FORMAT,
        "num_train": num_train,
        "num_val": num_val,
        "canvas": canvas,
        "min_digits": min_digits,
        "max_digits": max_digits,
        "min_size": min_size,
        "max_size": max_size,
        "seed": seed,
        "train_dir": train_dir,
        "val_dir": val_dir,
        "annotations_dir": annotations_dir,
    }
    if _digits_written(root, settings):
        return root
    _check_digits_settings(settings)
    if root.is_dir() and any(root.iterdir()) and not _digits_written(root, settings):  # not another process's
        raise HydraliError(f"{root} exists and is not a detection digits dataset: delete it or set data.root elsewhere")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        (tmp / annotations_dir).mkdir(parents=True)
        for split, folder, count in (("train", train_dir, num_train), ("val", val_dir, num_val)):
            _write_digits_split(
                tmp / folder, tmp / annotations_dir / annotation_file_name(folder), split, count, settings
            )
        (tmp / DIGITS_MARKER).write_text(json.dumps(settings))
        os.rename(tmp, root)
    except OSError as err:  # another process finished first (or root appeared): keep theirs, if it is the same
        if not _digits_written(root, settings):
            raise HydraliError(
                f"cannot write the detection digits to {root} ({err}): delete {root} or set data.root to another folder"
            ) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
