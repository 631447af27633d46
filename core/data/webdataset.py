"""Datasets as WebDataset tar shards, the layout DALI's `fn.readers.webdataset` reads (locally or from `s3://`).

    <root>/manifest.json                 what the shards hold: the task, each split's sample count and shards, the
                                         task's own facts (classes, ...), and how they were made
    <root>/<split>/shard-000000.tar      samples: the files of one sample share a key (000123.jpg, 000123.label, ...)
    <root>/<split>/shard-000000.idx      DALI's index of the tar (written by DALI's own wds2idx): a reader seeks to a
                                         sample instead of scanning the tar, so a process reads only its shard

DALI splits a split's samples into `num_shards` contiguous ranges over its tars in order (a range may cross tars)
and reads a range sequentially into its shuffle buffer (`initial_fill` samples): `hydrali convert` shuffles the
samples once when it writes them (with `seed`), so that a range mixes every class. Written into a temporary folder
renamed into place: a half-written dataset is never read.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import tarfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hydrali.core.data import object_store
from hydrali.core.data.image_files import IMAGE_EXTENSIONS
from hydrali.core.data.pipelines import Source
from hydrali.core.errors import HydraliError

FORMAT = "webdataset"
MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
INDEX_SUFFIX = ".idx"
KEY = "__key__"  # a sample's key, as WebDataset names it; every other entry is a file extension and its bytes
IMAGE = ";".join(sorted({e.lstrip(".") for e in IMAGE_EXTENSIONS}))  # fn.readers.webdataset's ext: any image file


def undecodable(root: str) -> str:
    """What to do when DALI cannot decode an image read from the shards at `root`."""
    return (
        f"an image in the shards of {root} cannot be decoded: convert the dataset again with "
        f"data.verify=full data.bad_files=skip"
    )


@dataclass(frozen=True)
class ShardedSplit:
    """One split of a sharded dataset: its sample count and its tar files (relative to the dataset's root)."""

    samples: int
    shards: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    """What a sharded dataset holds (manifest.json)."""

    task: str  # the task whose recipes read it (classification, detection)
    splits: dict[str, ShardedSplit]
    facts: dict[str, Any] = field(default_factory=dict)  # the task's own: classes, categories, per-class counts
    made_by: dict[str, Any] = field(default_factory=dict)  # the command, its source, seed and shard size
    format: str = FORMAT
    version: int = MANIFEST_VERSION

    def to_json(self) -> str:
        """The manifest as manifest.json holds it."""
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        """The manifest in `text` (read from `where`); a file that is not one is one line."""
        try:
            raw = json.loads(text)
            splits = {name: ShardedSplit(int(s["samples"]), tuple(s["shards"])) for name, s in raw["splits"].items()}
            manifest = cls(
                task=str(raw["task"]),
                splits=splits,
                facts=dict(raw.get("facts", {})),
                made_by=dict(raw.get("made_by", {})),
                format=str(raw.get("format", "")),
                version=int(raw.get("version", 0)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise HydraliError(f"{where} is not a hydrali manifest ({err}): write the shards again") from err
        if manifest.format != FORMAT or manifest.version > MANIFEST_VERSION:
            raise HydraliError(
                f"{where} describes format {manifest.format!r} version {manifest.version}; this hydrali reads "
                f"{FORMAT!r} up to version {MANIFEST_VERSION}"
            )
        return manifest


@dataclass(frozen=True)
class Shards:
    """Where one split's shards are: the tar files and their index files, as DALI's reader takes them."""

    paths: tuple[str, ...]
    index_paths: tuple[str, ...]
    samples: int


@dataclass(frozen=True)
class ShardSource(Source):
    """A Source whose split is WebDataset shards: DALI's fn.readers.webdataset reads `paths` through `index_paths`
    (hydrali.core.data.pipelines.Source.reader_args shards it as every reader)."""

    paths: tuple[str, ...] = ()
    index_paths: tuple[str, ...] = ()

    def webdataset_args(self) -> dict:
        """fn.readers.webdataset's arguments for these shards, the sharding included; a sample that lacks one of
        the extensions asked for is an error, never an empty output."""
        return {
            "paths": list(self.paths),
            "index_paths": list(self.index_paths),
            "missing_component_behavior": "error",
            **self.reader_args(),
        }

    @classmethod
    def of(cls, root: str, shards, shard_id: int, num_shards: int, is_training: bool) -> ShardSource:
        """The source of one split's `shards` (their paths and index_paths, as a sharded dataset lists them) under
        `root`, replica `shard_id` of `num_shards`."""
        return cls(root, shard_id, num_shards, is_training, paths=shards.paths, index_paths=shards.index_paths)


def read_manifest(root: str) -> Manifest:
    """The manifest of the sharded dataset at `root` (a folder or an s3:// prefix)."""
    where = object_store.join(root, MANIFEST)
    if not object_store.is_remote(root) and not Path(where).is_file():
        raise HydraliError(
            f"data.root={root} holds no {MANIFEST}: point it at a folder written by "
            f"`hydrali convert ... out=<folder> format=webdataset`"
        )
    try:
        text = object_store.read_bytes(where).decode("utf-8")
    except (UnicodeDecodeError, IsADirectoryError) as err:
        raise HydraliError(f"{where} is not a hydrali manifest ({err}): write the shards again") from err
    return Manifest.from_json(text, where)


def split_shards(root: str, manifest: Manifest, split: str) -> Shards:
    """The tar and index files of `split` under `root`, checked to exist (one line naming the first missing)."""
    if split not in manifest.splits:
        raise HydraliError(
            f"{object_store.join(root, MANIFEST)} has no split {split!r}: it holds {', '.join(manifest.splits)}"
        )
    entry = manifest.splits[split]
    paths = tuple(object_store.join(root, name) for name in entry.shards)
    index_paths = tuple(index_of(path) for path in paths)
    object_store.check_readable([*paths, *index_paths])
    return Shards(paths, index_paths, entry.samples)


def index_of(shard: str) -> str:
    """The index file of a tar shard (beside it)."""
    return shard[: -len(".tar")] + INDEX_SUFFIX if shard.endswith(".tar") else shard + INDEX_SUFFIX


def shard_count(samples: int, shard_size: int, min_shards: int) -> int:
    """How many tars a split of `samples` is written to: shard_size samples each at most, and at least min_shards
    (files to spread over storage and copy in parallel) while every tar keeps one sample."""
    return max(1, min(samples, max(math.ceil(samples / shard_size), min_shards)))


def write_split(
    samples: Iterable[dict[str, Any]],
    count: int,
    folder: Path,
    *,
    shard_size: int,
    min_shards: int,
    progress=None,
) -> ShardedSplit:
    """Write `count` samples (dicts of KEY and extension -> bytes) into tars of about equal size under `folder`, each
    with DALI's index beside it; `progress(n)` is told of every n samples written."""
    from wds2idx import IndexCreator  # DALI's own index writer (the wds2idx tool of its wheel)

    folder.mkdir(parents=True, exist_ok=True)
    tars = shard_count(count, shard_size, min_shards)
    sizes = [count // tars + (1 if i < count % tars else 0) for i in range(tars)]
    names, stream = [], iter(samples)
    for number, size in enumerate(sizes):
        tar_path = folder / f"shard-{number:06d}.tar"
        with tarfile.open(tar_path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(size):
                _add_sample(tar, next(stream))
                if progress is not None:
                    progress(1)
        with IndexCreator(str(tar_path), index_of(str(tar_path)), verbose=False) as index:
            index.create_index()
        names.append(f"{folder.name}/{tar_path.name}")
    leftover = next(stream, None)
    if leftover is not None:
        raise HydraliError(f"more samples than the {count} counted for {folder.name}: the data changed while read")
    return ShardedSplit(count, tuple(names))


def _add_sample(tar: tarfile.TarFile, sample: dict[str, Any]) -> None:
    key = str(sample[KEY])
    for extension, data in sample.items():
        if extension == KEY:
            continue
        info = tarfile.TarInfo(f"{key}.{extension}")
        info.size, info.mode, info.mtime = len(data), 0o644, 0  # the same bytes for the same data on every machine
        tar.addfile(info, io.BytesIO(data))


def publish(staging: Path, out: Path, manifest: Manifest) -> None:
    """Write the manifest into `staging` and move it to `out` in one rename."""
    (staging / MANIFEST).write_text(manifest.to_json())
    if out.exists():  # an empty folder given as out
        out.rmdir()
    os.rename(staging, out)


def staging_folder(out: Path) -> Path:
    """A fresh temporary folder beside `out` to write into (removed first if an interrupted run left it)."""
    staging = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging
