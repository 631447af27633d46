"""CIFAR-10 as JPEG folders (../shared/data/cifar10.tgz: cifar/train/<class>/*.jpg, cifar/val/<class>/*.jpg) for the
accuracy recipes: unpack it whole (the GPU runs of experiment=cifar10) or write a fixed subset of it as a tgz (the
CPU test's tests/data/cifar10-subset.tgz). From the repository root:
    python -m hydrali.bench.cifar10 ../shared/data/cifar10.tgz tests/data/cifar10-subset.tgz --train 200 --val 100
"""

from __future__ import annotations

import argparse
import io
import tarfile
from collections import defaultdict
from pathlib import Path

SPLITS = ("train", "val")


def subset_members(archive: tarfile.TarFile, per_split: dict[str, int]) -> list[tarfile.TarInfo]:
    """The first `per_split[split]` images of every class of each split, by file name (a fixed choice)."""
    by_class: dict[tuple[str, str], list[tarfile.TarInfo]] = defaultdict(list)
    for member in archive.getmembers():
        parts = Path(member.name).parts  # cifar/<split>/<class>/<file>
        if member.isfile() and len(parts) == 4 and parts[1] in per_split:
            by_class[(parts[1], parts[2])].append(member)
    chosen = []
    for (split, _), members in sorted(by_class.items()):
        chosen += sorted(members, key=lambda m: m.name)[: per_split[split]]
    return chosen


def write_subset(source: Path, target: Path, *, train_per_class: int, val_per_class: int) -> int:
    """Write `target`, a tgz of `source`'s first images of every class (same layout); return how many."""
    with tarfile.open(source) as archive, tarfile.open(target, "w:gz") as out:
        members = subset_members(archive, {"train": train_per_class, "val": val_per_class})
        for member in members:
            data = archive.extractfile(member).read()
            info = tarfile.TarInfo(member.name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644  # no dates: the same bytes every time
            out.addfile(info, io.BytesIO(data))
    return len(members)


def unpack(source: Path, destination: Path) -> Path:
    """Unpack a CIFAR-10 tgz (whole or a subset) under `destination`; return its dataset root (train/ and val/)."""
    with tarfile.open(source) as archive:
        archive.extractall(destination, filter="data")
    return destination / "cifar"


def main() -> None:
    """Write a subset tgz (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--train", type=int, required=True, help="training images per class")
    parser.add_argument("--val", type=int, required=True, help="validation images per class")
    args = parser.parse_args()
    count = write_subset(args.source, args.target, train_per_class=args.train, val_per_class=args.val)
    print(f"{args.target}: {count} images")


if __name__ == "__main__":
    main()
