"""`hydrali convert data=... out=DIR [format=webdataset] [shard_size=N]`: a dataset's splits written as shards that
DALI reads at scale (core.data.webdataset), read back with `data=webdataset data.root=DIR`.

The task says what a sample holds (its `shard_samples`), what the manifest records about the data (its
`shard_facts`) and which files the folder holds besides the tars (its optional `shard_files`); this command checks
the input as a training run would, writes every split beside `out` with a progress bar, and renames the folder into
place only when all of it is written.
"""

from __future__ import annotations

import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import open_dict

from hydrali.core.config.validate import check_config
from hydrali.core.data import object_store, webdataset
from hydrali.core.data.image_files import Verify
from hydrali.core.errors import HydraliError
from hydrali.core.inference.trained_run import compose
from hydrali.core.policies import seeding

SPLITS = ("train", "val")  # what convert writes: every split a run reads


def _refuse_nested(out: Path, root) -> None:
    """Refuse an `out` inside the dataset read (its shards would become part of it) or a dataset inside `out`."""
    if not root or object_store.is_remote(str(root)):
        return
    source, target = Path(str(root)).expanduser().resolve(), out.resolve()
    if target == source or source in target.parents:
        raise HydraliError(
            f"out={out} is inside data.root={source}: the shards would be written into the dataset; name a folder "
            f"outside it"
        )
    if target in source.parents:
        raise HydraliError(f"data.root={source} is inside out={out}: name an out= folder outside the dataset")


def convert(path: str | None, overrides: list[str]) -> None:
    """Write the dataset that `overrides` compose (task, data) as shards in `out`, and print what was written. The
    task must offer hydrali.core.contracts.task.ShardableTask; `seed=null` draws the shuffle's seed (recorded)."""
    if path is not None:
        raise HydraliError(f"hydrali convert takes key=value arguments only, not {path}: e.g. out={path}")
    cfg, options = compose("convert", overrides)
    if options.out is None:
        raise HydraliError("hydrali convert needs out=<folder>: where the shards are written")
    if options.shard_size < 1 or options.min_shards < 1:
        raise HydraliError(f"shard_size={options.shard_size} min_shards={options.min_shards}: both must be at least 1")
    if cfg.data.name == webdataset.FORMAT:
        raise HydraliError(
            f"data={cfg.data.name} is already sharded: name the dataset to convert (data=imagefolder, ...)"
        )
    if object_store.is_remote(options.out):
        raise HydraliError(f"out={options.out}: convert writes a local folder; copy it to object storage afterwards")
    out = Path(options.out).expanduser().absolute()
    _refuse_nested(out, cfg.data.get("root"))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HydraliError(f"out={out} already holds files: name a new or empty folder")
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)  # what a run's config names its output dir (resolved by Hydra in a run)
    check_config(cfg)
    task = instantiate(cfg.task)
    if not (hasattr(task, "shard_samples") and hasattr(task, "shard_facts")):  # core.contracts.task.ShardableTask
        raise HydraliError(f"task={cfg.task.name} cannot be written as shards yet")
    dataset = task.prepare_data(cfg.data, Verify(str(cfg.data.verify)))

    from tqdm import tqdm

    seed = seeding.resolve_seed(cfg.seed) if options.shuffle else None
    if options.shuffle and cfg.seed is None:
        seeding.announce_drawn(seed)
    staging = webdataset.staging_folder(out)
    splits = {}
    try:
        for split in SPLITS:
            count, samples = task.shard_samples(dataset, split, seed=seed)
            with tqdm(total=count, desc=f"{split}", unit="sample", disable=not sys.stderr.isatty(), leave=False) as bar:
                splits[split] = webdataset.write_split(
                    samples,
                    count,
                    staging / split,
                    shard_size=options.shard_size,
                    min_shards=options.min_shards,
                    progress=bar.update,
                )
        extra = task.shard_files(dataset) if hasattr(task, "shard_files") else {}  # the task's files beside the tars
        for name, content in extra.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(content)
        manifest = webdataset.Manifest(
            task=str(cfg.task.name),
            splits=splits,
            facts=task.shard_facts(dataset),
            made_by={
                "command": "hydrali convert " + " ".join(shlex.quote(o) for o in overrides),
                "data": str(cfg.data.name),
                "source": str(cfg.data.root),
                "image_size": int(cfg.data.image_size),  # what data=webdataset trains at unless told otherwise
                "seed": seed,  # null: written in the dataset's order (shuffle=false)
                "shuffled": bool(options.shuffle),
                "shard_size": int(options.shard_size),
                "min_shards": int(options.min_shards),
                "skipped": [str(path) for path, _ in getattr(dataset, "skipped", ())],  # data.bad_files=skip
                "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            },
        )
        webdataset.publish(staging, out, manifest)
    except BaseException:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        raise
    for split, written in splits.items():
        few = len(written.shards) < options.min_shards
        note = f" (fewer than min_shards={options.min_shards}: the split has {written.samples} samples)" if few else ""
        print(f"{split:5s}: {written.samples} samples in {len(written.shards)} shards{note}")
    reading = getattr(task, "shard_reading", "data=webdataset")  # the overrides that train from the shards
    print(f"wrote {out} ({webdataset.MANIFEST}); train from it with {reading} data.root={out}")
