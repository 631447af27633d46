"""Classification data on disk: the bundled digits written as JPEG files, and any image folder.

Both end in ImageNet's layout, <root>/train/<class>/*.jpg and <root>/val/<class>/*.jpg, which is
what DALI's file reader reads (labels are the class folders in sorted order).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from hydrali.core.data.image_files import IMAGE_EXTENSIONS
from hydrali.core.errors import HydraliError

DIGITS_MARKER = "hydrali-digits.json"
DIGITS_SPLIT_SEED = 0  # the train/val split of digits is fixed: the same files on every machine
DIGITS_JPEG_QUALITY = 95


@dataclass(frozen=True)
class ImageFolderInfo:
    """A scanned dataset: its split folders, class names and sizes."""

    root: Path
    classes: tuple[str, ...]
    num_train: int
    num_val: int
    skipped: tuple[tuple[Path, str], ...] = ()  # bad files left out (data.bad_files=skip), with why
    train_per_class: tuple[int, ...] = ()  # training images of each class (in the order of `classes`)
    class_weights: tuple[float, ...] | None = None  # the loss's weight of each class (task.class_weights); None: 1
    val_split: str = "val"  # the folder scored as the validation split (hydrali eval split=test: test)
    val_files: tuple[str, ...] | None = None  # the validation split's files (relative to it), unlabelled: read
    #   instead of its class folders (hydrali predict)

    def without(self, bad: list[tuple[Path, str]]) -> ImageFolderInfo:
        """This dataset with the files of `bad` left out (and counted out)."""
        gone = {path for path, _ in bad}
        splits = ("train", self.val_split)
        counts = [sum(p in gone for p in image_files([self.root / split])) for split in splits]
        for split, count, total in zip(splits, counts, (self.num_train, self.num_val)):
            if count == total:
                raise HydraliError(
                    f"every image file of {self.root / split} cannot be decoded: nothing is left to read"
                )
        gone_from = [path.parent for path in gone]
        per_class = tuple(n - gone_from.count(self.train_dir / c) for c, n in zip(self.classes, self.train_per_class))
        return replace(
            self,
            num_train=self.num_train - counts[0],
            num_val=self.num_val - counts[1],
            skipped=tuple(bad),
            train_per_class=per_class,
        )

    def listed_files(self, split_dir: Path) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
        """The files of a split (relative to it) and their labels when some were left out; None when every file
        of the split's class folders is read. Unlabelled files (val_files) are all labelled 0."""
        if self.val_files is not None and split_dir == self.val_dir:
            return self.val_files, (0,) * len(self.val_files)
        if not self.skipped:
            return None
        gone = {path for path, _ in self.skipped}
        kept = [
            (str(path.relative_to(split_dir)), label)
            for label, name in enumerate(self.classes)
            for path in _images_in(split_dir / name)
            if path not in gone
        ]
        return tuple(f for f, _ in kept), tuple(label for _, label in kept)

    @property
    def train_dir(self) -> Path:
        """The training split's folder."""
        return self.root / "train"

    @property
    def val_dir(self) -> Path:
        """The validation split's folder."""
        return self.root / self.val_split

    @property
    def num_classes(self) -> int:
        """The number of class folders."""
        return len(self.classes)

    def params(self) -> dict:
        """What is logged to MLflow about the data."""
        return dataset_params(self)


def dataset_params(dataset) -> dict:
    """What is logged to MLflow about a classification dataset (a folder or shards): its class and image counts and
    the range of its class weights."""
    w = dataset.class_weights
    weights = {"dataset/class_weight_min": min(w), "dataset/class_weight_max": max(w)} if w else {}
    return {
        "dataset/num_classes": dataset.num_classes,
        "dataset/num_train": dataset.num_train,
        "dataset/num_val": dataset.num_val,
        **weights,
    }


def _images_in(folder: Path) -> list[Path]:
    """The image files of `folder` (followed symlinks too), in the order of their names (as Paths of one folder sort):
    read from its directory entries, without a stat of each file or Path comparisons (60,000 files: 0.3 s, not 3)."""
    with os.scandir(folder) as entries:
        names = sorted(
            e.name for e in entries if e.is_file() and os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS
        )
    return [folder / name for name in names]


def scan_image_folder(root: str | os.PathLike, val_split: str = "val") -> ImageFolderInfo:
    """Check that `root` holds train/ and val/ (or `val_split`/) with the same class folders of images, and count
    them."""
    root = Path(root)
    if not root.is_dir():
        raise HydraliError(f"data.root={root} does not exist: point data.root at a folder holding train/ and val/")
    classes_of, counts, sizes = {}, {}, {}
    splits = ("train", val_split)
    for split in splits:
        split_dir = root / split
        if not split_dir.is_dir():
            raise HydraliError(
                f"{split_dir} is missing: data.root must hold {' and '.join(f'{x}/' for x in splits)}, one sub-folder "
                f"per class"
            )
        classes = tuple(sorted(d.name for d in split_dir.iterdir() if d.is_dir()))
        if not classes:
            raise HydraliError(f"{split_dir} has no class folders: put the images in {split_dir}/<class>/")
        sizes[split] = {c: len(_images_in(split_dir / c)) for c in classes}  # each class folder read once
        empty = [c for c in classes if not sizes[split][c]]
        if len(empty) == len(classes):
            raise HydraliError(f"{split_dir} holds no images: expected files like {split_dir}/{classes[0]}/xxx.jpg")
        if empty:
            raise HydraliError(f"{split_dir}/{empty[0]} holds no images: add some or remove the folder")
        classes_of[split], counts[split] = classes, sum(sizes[split].values())
    if classes_of["train"] != classes_of[val_split]:
        only = sorted(set(classes_of["train"]) ^ set(classes_of[val_split]))
        raise HydraliError(
            f"train/ and {val_split}/ of {root} have different class folders ({', '.join(only[:5])}): "
            f"give both the same classes"
        )
    per_class = tuple(sizes["train"][c] for c in classes_of["train"])
    return ImageFolderInfo(
        root, classes_of["train"], counts["train"], counts[val_split], train_per_class=per_class, val_split=val_split
    )


def image_files(folders: list[Path]) -> list[Path]:
    """The image files of split folders (one sub-folder per class), in DALI's reading order."""
    return [p for folder in folders for d in sorted(x for x in folder.iterdir() if x.is_dir()) for p in _images_in(d)]


def write_digits(root: str | os.PathLike, size: int, val_fraction: float) -> Path:
    """Write scikit-learn's digits once as size x size JPEG files in train/ and val/ under `root`.

    The split is stratified and fixed. Writing goes to a temporary folder renamed into place, so
    several processes may call this at once and a half-written dataset is never read.
    """
    root = Path(root)
    settings = {"size": size, "val_fraction": val_fraction, "split_seed": DIGITS_SPLIT_SEED}
    marker = root / DIGITS_MARKER
    if marker.exists():
        written = json.loads(marker.read_text())
        if written != settings:
            raise HydraliError(
                f"{root} holds digits written with {written}, not {settings}: "
                f"delete {root} or set data.root to another folder"
            )
        return root
    if not 0.0 < val_fraction < 1.0:
        raise HydraliError(f"data.val_fraction={val_fraction}: it must be between 0 and 1")
    if size < 8:
        raise HydraliError(f"data.size={size}: digits are 8x8 scans, write them at 8 pixels or more")

    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    indices = np.arange(len(digits.target))
    train_idx, val_idx = train_test_split(
        indices, test_size=val_fraction, stratify=digits.target, random_state=DIGITS_SPLIT_SEED
    )
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
    for split, idx in (("train", train_idx), ("val", val_idx)):
        for i in idx:
            folder = tmp / split / str(digits.target[i])
            folder.mkdir(parents=True, exist_ok=True)
            pixels = (digits.images[i] * (255.0 / 16.0)).round().astype(np.uint8)
            image = Image.fromarray(pixels, mode="L").resize((size, size), Image.Resampling.BICUBIC)
            image.save(folder / f"{i:04d}.jpg", quality=DIGITS_JPEG_QUALITY)
    (tmp / DIGITS_MARKER).write_text(json.dumps(settings))
    try:
        os.rename(tmp, root)
    except OSError as err:  # another process finished first (or root exists): keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not marker.exists():
            raise HydraliError(
                f"{root} exists but is not a digits dataset: delete it or set data.root elsewhere"
            ) from err
    return root
