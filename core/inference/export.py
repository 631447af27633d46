"""`hydrali export RUN_DIR format=onnx|torchscript|saved_model [out=DIR] [key=value ...]`: the run's trained network
in a serving format (each backend says which it writes), checked when written: its outputs on a batch of the run's
validation images, computed by the format's own runtime, against the framework's (within `tolerance`). Beside it,
the serialized DALI validation pipeline (Pipeline.serialize) and preprocessing.json (input size, layout, dtype,
mean and std, class names), so that a serving stack reproduces the training preprocessing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hydrali.core.data.image_files import Verify
from hydrali.core.errors import HydraliError
from hydrali.core.inference.batches import validation_pipeline
from hydrali.core.inference.loaded import Loaded, load
from hydrali.core.inference.trained_run import open_run

PIPELINE_FILE = "dali_pipeline.bin"  # the serialized DALI validation pipeline (Pipeline.serialize)
PREPROCESSING_FILE = "preprocessing.json"  # what the model expects
CHECK_FILE = "check.json"  # the export's outputs against the framework's
INPUT_DTYPES = {"float": "float32", "float16": "float16"}  # pipeline.dtype -> the images' dtype a model is fed


def export(path: str | None, overrides: list[str]) -> Path:
    """Export the network of the run in `path` as `format`; return the file or folder a serving stack loads."""
    run = open_run("export", path, overrides)
    fmt = str(run.options.format)
    loaded = load(run, lambda task: task.prepare_data(run.cfg.data, Verify.off), "prepare_data")
    if fmt not in loaded.network.formats:
        raise HydraliError(
            f"format={fmt}: backend={run.backend} exports {' or '.join(loaded.network.formats)}: pass one of them"
        )
    batch = _check_batch(loaded, int(run.options.check_images))
    out = Path(str(run.options.out)).expanduser()
    out = ((out if out.is_absolute() else run.run_dir / out) / fmt).resolve()  # one folder per format
    model = loaded.network.export(fmt, out, batch)
    check = _check(loaded, model, fmt, batch, float(run.options.tolerance))
    (out / CHECK_FILE).write_text(json.dumps(check, indent=1) + "\n")
    print(f"hydrali export: {loaded.describe()}", flush=True)
    print(
        f"{fmt}: {model}; checked on {check['images']} validation images: largest difference from "
        f"{run.backend} {check['max_abs_difference']:.2e} (tolerance {check['tolerance']:g}): {check['result']}",
        flush=True,
    )
    if check["result"] != "passed":  # the folder holds the model and check.json, not what a serving stack takes
        raise HydraliError(
            f"the exported model's outputs differ from {run.backend}'s by {check['max_abs_difference']:.2e}, more "
            f"than tolerance={check['tolerance']:g} ({out / CHECK_FILE})"
        )
    (out / PREPROCESSING_FILE).write_text(json.dumps(preprocessing(loaded, check["outputs"]), indent=1) + "\n")
    serialize_pipeline(loaded, out / PIPELINE_FILE)
    print(f"beside it: {out / PIPELINE_FILE} (DALI validation pipeline), {out / PREPROCESSING_FILE}", flush=True)
    return model


def _check_batch(loaded: Loaded, images: int) -> dict:
    """The first `images` validation images (at least one batch's worth is read), as one batch."""
    if images < 1:
        raise HydraliError(f"check_images={images}: the export is checked on at least 1 image")
    taken, parts = 0, []
    for batch in loaded.batches("read"):
        parts.append(batch)
        taken += len(next(iter(batch.values())))
        if taken >= images:
            break
    return {
        name: np.concatenate([part[name] for part in parts])[:images]
        for name, value in parts[0].items()
        if isinstance(value, np.ndarray)
    }


def _check(loaded: Loaded, model: Path, fmt: str, batch: dict, tolerance: float) -> dict:
    """The exported model's outputs against the framework's on `batch`."""
    expected = loaded.network.serve(batch)
    produced = loaded.network.run_export(model, fmt, batch)
    difference = max(float(np.max(np.abs(expected[name] - produced[name]))) for name in expected)
    return {
        "format": fmt,
        "images": int(len(next(iter(batch.values())))),
        "outputs": sorted(expected),
        "max_abs_difference": difference,
        "tolerance": tolerance,
        "result": "passed" if difference <= tolerance else "failed",
    }


def preprocessing(loaded: Loaded, outputs: list[str]) -> dict:
    """What the exported model expects of its input, and what its outputs mean."""
    cfg = loaded.run.cfg
    options = cfg.pipeline.options
    return {
        "input": "images",
        "layout": "N" + loaded.backend.layout,
        "dtype": INPUT_DTYPES[str(cfg.pipeline.dtype)],
        "image_size": int(cfg.data.image_size),
        "recipe": str(cfg.pipeline.recipe),
        "mean": [float(m) for m in options.get("mean", ())],
        "std": [float(s) for s in options.get("std", ())],
        "val_crop_fraction": options.get("val_crop_fraction"),
        "note": "pixels in [0, 255] become (pixel - 255 * mean) / (255 * std), RGB; dali_pipeline.bin does it all",
        "classes": list(getattr(loaded.dataset, "classes", ())),
        "outputs": outputs,
        **({"postprocessing": loaded.task.postprocessing()} if hasattr(loaded.task, "postprocessing") else {}),
    }


def serialize_pipeline(loaded: Loaded, path: Path) -> None:
    """The run's DALI validation pipeline (one shard: the whole split), serialized by DALI."""
    pipe = validation_pipeline(
        task=loaded.task, cfg=loaded.run.cfg, dataset=loaded.dataset, layout=loaded.backend.layout, device=loaded.device
    )
    pipe.serialize(filename=str(path))
