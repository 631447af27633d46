"""How fast a classification recipe alone feeds a GPU (no training): images per second of the task's own training
pipeline, as `hydrali <overrides>` would build it for one replica. Run on the GPU machine (after
bench/gpu/env.sh), from the repository root, one NAME=OVERRIDES argument per setting:

    python3 -m hydrali.bench.gpu.small_image_feed /tmp/cifar/cifar "files=experiment=cifar10" \
        "memory=experiment=cifar10 pipeline.options.decode_once=true"

Prints one line per setting: seconds to build its pipeline (a decode-once step included, done once for all the
settings that share it) and the steady images/s over `--batches` batches."""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

from hydra import compose, initialize_config_module

from hydrali.core.config.store import register_schemas
from hydrali.tasks.classification.datasets import scan_image_folder
from hydrali.tasks.classification.task import ClassificationTask


def feed_rate(task, cfg, root: str, batches: int, device: str) -> tuple[float, float]:
    """(seconds to build the pipeline, decode-once step included; steady images/s) of `task`'s training pipeline."""
    started = time.perf_counter()
    pipe = task.build_pipeline(
        pipeline=cfg.pipeline,
        data=cfg.data,
        model=cfg.model,
        dataset=scan_image_folder(root),
        plan=SimpleNamespace(per_replica_batch=cfg.data.batch_size, num_shards=1, device=device),
        shard=SimpleNamespace(shard_id=0, device_id=0 if device == "gpu" else None, pipeline_seed=1),
        layout="CHW",
        is_training=True,
    )
    pipe.build()
    built = time.perf_counter() - started
    for _ in range(5):
        pipe.run()
    started = time.perf_counter()
    for _ in range(batches):
        outputs = pipe.run()
    outputs[0].as_cpu()  # waits for the last batch
    return built, batches * cfg.data.batch_size / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="the dataset's folder (train/<class>/, val/<class>/)")
    parser.add_argument("settings", nargs="+", help="NAME=OVERRIDES: a name, then hydrali overrides")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--device", default="gpu")
    args = parser.parse_args()
    register_schemas()
    task = ClassificationTask(name="classification", monitor="val/acc", mode="max", sides={}, label_smoothing=0.0)
    for setting in args.settings:
        name, _, overrides = setting.partition("=")
        with initialize_config_module(config_module="hydrali.conf", version_base="1.3"):
            cfg = compose("config", overrides=[f"data.root={args.root}", *overrides.split()])
        built, rate = feed_rate(task, cfg, args.root, args.batches, args.device)
        print(f"{name:>12}: built in {built:5.1f} s, {rate:8,.0f} images/s   ({overrides})", flush=True)


if __name__ == "__main__":
    main()
