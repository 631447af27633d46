"""DALI recipes for classification. They know nothing of torch or TensorFlow.

Every recipe reads its `source` (hydrali.core.data.pipelines.Source: a folder with one sub-folder per class and
this replica's shard of it) through a file reader named "Reader" and returns (images, labels):
images normalised, in `layout` (CHW for torch, HWC for Keras); labels int32. `device="cpu"` uses
CPU operators only; `device="gpu"` decodes with the mixed (nvJPEG / hardware) decoder and works on
the GPU. A recipe's own options are its keyword-only parameters, set in `pipeline.options`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import nvidia.dali.fn as fn
import nvidia.dali.types as types
from nvidia.dali import pipeline_def
from nvidia.dali.auto_aug import auto_augment as dali_auto_augment
from nvidia.dali.auto_aug import rand_augment as dali_rand_augment
from nvidia.dali.auto_aug import trivial_augment as dali_trivial_augment

from hydrali.core.data.pipelines import Source, decoder_args
from hydrali.core.data.webdataset import ShardSource
from hydrali.tasks.classification import sharded

_DTYPES = {"float": types.FLOAT, "float16": types.FLOAT16}


@dataclass(frozen=True)
class FolderSource(Source):
    """A Source whose `root` is a split's class folders: every image in them, or only `files` (relative to root)
    with their `labels` (when some were left out)."""

    files: tuple[str, ...] | None = None
    labels: tuple[int, ...] | None = None


def read_files(source: Source, initial_fill: int):
    """The sharded file reader every recipe starts with: (encoded images, labels), named "Reader". A plain Source
    reads every image of its class folders; a FolderSource may list them; a ShardSource reads tar shards (each
    sample's image file and its int32 label)."""
    if isinstance(source, ShardSource):
        return fn.readers.webdataset(
            ext=[sharded.IMAGE, sharded.LABEL],
            dtypes=[types.UINT8, types.INT32],
            initial_fill=initial_fill,
            **source.webdataset_args(),
        )
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


AutoAugment = Literal["rand_augment", "trivial_augment", "auto_augment"]


def _auto_augment(images, policy: str, image_size: int, n: int, m: int):
    """DALI's automatic augmentation `policy` (nvidia.dali.auto_aug) on uint8 HWC images of image_size sides:
    RandAugment (n operations of magnitude m out of 30), TrivialAugment Wide, or AutoAugment's ImageNet policy."""
    shape = (image_size, image_size)
    if policy == "rand_augment":
        return dali_rand_augment.rand_augment(images, n=n, m=m, shape=shape)
    if policy == "trivial_augment":
        return dali_trivial_augment.trivial_augment_wide(images, shape=shape)
    return dali_auto_augment.auto_augment_image_net(images, shape=shape)


@pipeline_def(enable_conditionals=True)  # DALI's automatic augmentations pick operations per sample by conditionals
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
    auto_augment: Optional[AutoAugment] = None,
    rand_augment_n: int = 2,
    rand_augment_m: int = 9,
):
    """Training: random-resized-crop decode, resize, an automatic augmentation policy if asked, random flip,
    normalize. Validation: decode, resize the shorter side to image_size / val_crop_fraction, center crop."""
    jpegs, labels = read_files(source, initial_fill)
    if source.is_training:
        images = _decode(jpegs, device, hw_decoder_load, random_area, random_aspect_ratio)
        images = fn.resize(images, resize_x=image_size, resize_y=image_size)
        if auto_augment is not None:
            images = _auto_augment(images, auto_augment, image_size, rand_augment_n, rand_augment_m)
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
