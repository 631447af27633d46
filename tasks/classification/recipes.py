"""DALI recipes for classification. They know nothing of torch or TensorFlow.

Every recipe reads its `source` (hydrali.core.data.pipelines.Source: a folder with one sub-folder per class and
this replica's shard of it) through a file reader named "Reader" and returns (images, labels):
images normalised, in `layout` (CHW for torch, HWC for Keras); labels int32. `device="cpu"` uses
CPU operators only; `device="gpu"` decodes with the mixed (nvJPEG / hardware) decoder and works on
the GPU. A recipe's own options are its keyword-only parameters, set in `pipeline.options`.
"""

from __future__ import annotations

from dataclasses import dataclass

import nvidia.dali.fn as fn
import nvidia.dali.types as types
from nvidia.dali import pipeline_def

from hydrali.core.data.pipelines import Source, decoder_args

_DTYPES = {"float": types.FLOAT, "float16": types.FLOAT16}


@dataclass(frozen=True)
class FolderSource(Source):
    """A Source whose `root` is a split's class folders: every image in them, or only `files` (relative to root)
    with their `labels` (when some were left out)."""

    files: tuple[str, ...] | None = None
    labels: tuple[int, ...] | None = None


def read_files(source: Source, initial_fill: int):
    """The sharded file reader every recipe starts with: (encoded images, labels), named "Reader". A plain Source
    reads every image of its class folders; a FolderSource may list them."""
    files = getattr(source, "files", None)
    listed = {} if files is None else {"files": list(files), "labels": list(source.labels)}
    return fn.readers.file(file_root=source.root, initial_fill=initial_fill, **listed, **source.reader_args())


def _decode(jpegs, device, hw_decoder_load, random_area=None, random_aspect_ratio=None):
    """Decode to RGB; with random_area, decode only a random-resized crop (ImageNet style)."""
    gpu = decoder_args(device, hw_decoder_load)
    if random_area is None:
        return fn.decoders.image(jpegs, output_type=types.RGB, **gpu)
    return fn.decoders.image_random_crop(
        jpegs,
        output_type=types.RGB,
        random_area=random_area,
        random_aspect_ratio=random_aspect_ratio,
        num_attempts=100,
        **gpu,
    )


def _normalize(images, image_size, layout, mean, std, dtype, mirror=None):
    flip = {} if mirror is None else {"mirror": mirror}
    return fn.crop_mirror_normalize(
        images,
        dtype=_DTYPES[dtype],
        output_layout=layout,
        crop=(image_size, image_size),
        mean=[m * 255 for m in mean],
        std=[s * 255 for s in std],
        **flip,
    )


def _labels(labels, device):
    return labels.gpu() if device == "gpu" else labels


@pipeline_def
def standard(
    source,
    device,
    layout,
    image_size,
    dtype,
    hw_decoder_load,
    *,
    random_area,
    random_aspect_ratio,
    flip_probability,
    mean,
    std,
    val_crop_fraction,
    initial_fill,
):
    """Training: random-resized-crop decode, resize, random flip, normalize.
    Validation: decode, resize the shorter side to image_size / val_crop_fraction, center crop."""
    jpegs, labels = read_files(source, initial_fill)
    if source.is_training:
        images = _decode(jpegs, device, hw_decoder_load, random_area, random_aspect_ratio)
        images = fn.resize(images, resize_x=image_size, resize_y=image_size)
        mirror = fn.random.coin_flip(probability=flip_probability)
    else:
        images = _decode(jpegs, device, hw_decoder_load)
        images = fn.resize(images, resize_shorter=image_size / val_crop_fraction)
        mirror = None
    return _normalize(images, image_size, layout, mean, std, dtype, mirror), _labels(labels, device)


@pipeline_def
def light(source, device, layout, image_size, dtype, hw_decoder_load, *, mean, std, initial_fill, flip_probability=0.0):
    """Decode, resize to image_size x image_size, normalize; in training, a random flip if flip_probability > 0."""
    jpegs, labels = read_files(source, initial_fill)
    images = _decode(jpegs, device, hw_decoder_load)
    images = fn.resize(images, resize_x=image_size, resize_y=image_size)
    mirror = fn.random.coin_flip(probability=flip_probability) if source.is_training and flip_probability else None
    return _normalize(images, image_size, layout, mean, std, dtype, mirror), _labels(labels, device)
