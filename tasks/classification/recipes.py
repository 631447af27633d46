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
from hydrali.core.errors import HydraliError
from hydrali.tasks.classification import sharded
from hydrali.tasks.classification.boxes import ERASE_AXES
from hydrali.tasks.classification.mixing import Mixing, mix_batch
from hydrali.tasks.recipe_steps import DTYPES, decode, normalize, on_device


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
    if random_area is None:
        return decode(jpegs, device, hw_decoder_load)
    return fn.decoders.image_random_crop(
        jpegs,
        output_type=types.RGB,
        random_area=random_area,
        random_aspect_ratio=random_aspect_ratio,
        num_attempts=100,
        **decoder_args(device, hw_decoder_load),
    )


def _cast(images, from_dtype: str, to_dtype: str):
    """Images of `from_dtype` (float | float16) as `to_dtype`; unchanged when they are the same."""
    return images if from_dtype == to_dtype else fn.cast(images, dtype=DTYPES[to_dtype])


def _training_outputs(images, labels, mixing: Mixing, num_classes, side: int, layout: str, device: str, dtype):
    """A training batch's (images, labels): normalized float `images` of side x side pixels mixed as `mixing` says
    (then labels are soft targets over num_classes, float32), in the recipe's `dtype`."""
    if not mixing.on:
        return images, on_device(labels, device)
    if num_classes is None:
        raise ValueError("mixup and cutmix need the number of classes (the task passes num_classes)")
    images = _cast(images, dtype, "float")  # DALI's arithmetic takes no float16
    images, labels = mix_batch(images, labels, mixing, num_classes=num_classes, side=side, layout=layout, device=device)
    return _cast(images, "float", dtype), labels


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
    num_classes=None,
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
    # defaults: for runs recorded before these options existed (hydrali eval reads their config)
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
    mix_probability: float = 1.0,
    switch_probability: float = 0.5,
):
    """Training: random-resized-crop decode, resize, an automatic augmentation policy if asked, random flip,
    normalize, mixup / cutmix if asked (hydrali.tasks.classification.mixing; labels then soft targets over
    num_classes). Validation: decode, resize the shorter side to image_size / val_crop_fraction, center crop."""
    jpegs, labels = read_files(source, initial_fill)
    if not source.is_training:
        images = decode(jpegs, device, hw_decoder_load)
        images = fn.resize(images, resize_shorter=image_size / val_crop_fraction)
        return normalize(images, image_size, layout, mean, std, dtype), on_device(labels, device)
    images = _decode(jpegs, device, hw_decoder_load, random_area, random_aspect_ratio)
    images = fn.resize(images, resize_x=image_size, resize_y=image_size)
    if auto_augment is not None:
        images = _auto_augment(images, auto_augment, image_size, rand_augment_n, rand_augment_m)
    mirror = fn.random.coin_flip(probability=flip_probability)
    images = normalize(images, image_size, layout, mean, std, dtype, mirror)
    mixing = Mixing(mixup_alpha, cutmix_alpha, mix_probability, switch_probability)
    return _training_outputs(images, labels, mixing, num_classes, image_size, layout, device, dtype)


@pipeline_def
def light(
    source,
    device,
    layout,
    image_size,
    dtype,
    hw_decoder_load,
    num_classes=None,
    *,
    mean,
    std,
    initial_fill,
    flip_probability=0.0,
):
    """Decode, resize to image_size x image_size, normalize; in training, a random flip if flip_probability > 0."""
    jpegs, labels = read_files(source, initial_fill)
    images = decode(jpegs, device, hw_decoder_load)
    images = fn.resize(images, resize_x=image_size, resize_y=image_size)
    mirror = fn.random.coin_flip(probability=flip_probability) if source.is_training and flip_probability else None
    return normalize(images, image_size, layout, mean, std, dtype, mirror), on_device(labels, device)


PadMode = Literal["reflect", "zero"]


def _mirrored_strip(images, start: int, width: int, axis: str):
    """The `width` pixels of `images` from `start` along `axis` (H or W), flipped along it."""
    strip = fn.slice(images, start=[start], shape=[width], axis_names=axis)
    return fn.flip(strip, horizontal=int(axis == "W"), vertical=int(axis == "H"))


def _reflect_pad(images, pad: int, side: int):
    """HWC images of side x side pixels padded by `pad` pixels on each side with their mirror image, the border
    pixel not repeated (numpy's and torch's `reflect`)."""
    for axis in ("W", "H"):
        before = _mirrored_strip(images, 1, pad, axis)
        after = _mirrored_strip(images, side - 1 - pad, pad, axis)
        images = fn.cat(before, images, after, axis_name=axis)
    return images


def _pad(images, side: int, pad: int, pad_mode: PadMode):
    """HWC images of side x side pixels padded by `pad` pixels on each side, with zeros or their mirror image."""
    if pad == 0:
        return images
    if pad_mode == "reflect":
        return _reflect_pad(images, pad, side)
    grown = {"start": [-pad, -pad], "shape": [side + 2 * pad] * 2, "axis_names": "HW"}
    return fn.slice(images, **grown, out_of_bounds_policy="pad", fill_values=0)


def _random_window(pad: int):
    """(y, x) of a random window in images padded by `pad` pixels, as crop_mirror_normalize's crop_pos: an integer
    offset of 0..2 * pad pixels per axis, each equally likely (k / (2 * pad) of the room left: exact in binary
    floating point for the pads a 32 px image takes); None without padding."""
    if pad == 0:
        return None
    return [fn.random.uniform(values=[k / (2 * pad) for k in range(2 * pad + 1)]) for _ in "yx"]


def _check_small_image_options(side: int, pad: int, pad_mode: PadMode, cutout: int) -> None:
    """Fail, naming the option, when pad or cutout cannot apply to images of side x side pixels."""
    largest_pad = side - 1 if pad_mode == "reflect" else side  # a mirror image needs pixels beyond the border one
    if not 0 <= pad <= largest_pad:
        raise HydraliError(
            f"pipeline.options.pad={pad}: pass 0..{largest_pad} for data.image_size={side} and pad_mode={pad_mode}"
        )
    if not 0 <= cutout <= side:
        raise HydraliError(f"pipeline.options.cutout={cutout}: pass 0 (off) .. {side} (data.image_size)")


def _cutout(images, side: int, length: int):
    """Images of side x side pixels with a `length` x `length` square centred at a random pixel (its top-left corner
    `length // 2` above and left of it, as boxes.random_box places a box) set to 0, clipped to the image (fn.erase
    trims what lies outside); 0 leaves them as they are. Two operators, not random_box's dozen: cutout needs no
    clipped box area."""
    if not length:
        return images
    top_left = fn.random.uniform(values=[float(centre - length // 2) for centre in range(side)], shape=[2])
    return fn.erase(images, anchor=top_left, shape=[float(length)] * 2, axis_names=ERASE_AXES, fill_value=0.0)


def _square_images(source, device, image_size, hw_decoder_load, initial_fill, pad=0, pad_mode="reflect"):
    """(uint8 HWC images of image_size x image_size padded by `pad` pixels, labels) of `source`: read from its files,
    decoded, resized and padded, or taken from memory when the source holds them so (Source.decoded)."""
    if source.decoded is None:
        jpegs, labels = read_files(source, initial_fill)
        images = decode(jpegs, device, hw_decoder_load)
        images = fn.resize(images, resize_x=image_size, resize_y=image_size)
        return _pad(images, image_size, pad, pad_mode), labels
    batches = source.decoded
    images = fn.external_source(source=batches.images, batch=True, batch_info=True, layout="HWC", dtype=types.UINT8)
    labels = fn.external_source(source=batches.labels, batch=True, batch_info=True, dtype=types.INT32)
    return on_device(images, device), labels


@pipeline_def
def square_images(source, device, image_size, hw_decoder_load, initial_fill=1, pad=0, pad_mode="reflect"):
    """The files of `source` decoded, resized to image_size x image_size and padded by `pad` pixels (small_images'
    pad_mode), uint8 HWC, with their labels: what small_images with `decode_once` keeps in memory
    (hydrali.core.data.decoded.decode_shard)."""
    return _square_images(source, device, image_size, hw_decoder_load, initial_fill, pad, pad_mode)


@pipeline_def
def small_images(
    source,
    device,
    layout,
    image_size,
    dtype,
    hw_decoder_load,
    num_classes=None,
    *,
    pad,
    pad_mode: PadMode,
    flip_probability,
    cutout,
    mean,
    std,
    initial_fill,
    mixup_alpha,
    cutmix_alpha,
    mix_probability,
    switch_probability,
    decode_once: bool = False,  # default: for runs recorded before this option existed (hydrali eval reads them)
):
    """CIFAR-style training on small photos. Training: decode, resize to image_size x image_size (images of that
    size pass unchanged), pad by `pad` pixels and crop a random image_size x image_size window, random flip,
    normalize, cutout (a square set to 0, the mean colour, after normalization), mixup / cutmix if asked (labels
    then soft targets over num_classes). Validation: decode, resize to image_size x image_size, normalize. With
    `decode_once`, decoding, resizing and padding happened once before training (the task keeps the result in
    memory: Source.decoded) and every batch starts from there."""
    _check_small_image_options(image_size, pad, pad_mode, cutout)
    if decode_once and source.decoded is None:
        raise HydraliError(
            "pipeline.options.decode_once=true: the source holds no decoded images (the task decodes them: "
            "build the pipeline through the task, or pass decode_once=false)"
        )
    if not source.is_training:
        images, labels = _square_images(source, device, image_size, hw_decoder_load, initial_fill)
        return normalize(images, image_size, layout, mean, std, dtype), on_device(labels, device)
    images, labels = _square_images(source, device, image_size, hw_decoder_load, initial_fill, pad, pad_mode)
    mirror = fn.random.coin_flip(probability=flip_probability)
    window = _random_window(pad)  # one operator crops the window, mirrors and normalizes it
    images = _cutout(normalize(images, image_size, layout, mean, std, dtype, mirror, window), image_size, cutout)
    mixing = Mixing(mixup_alpha, cutmix_alpha, mix_probability, switch_probability)
    return _training_outputs(images, labels, mixing, num_classes, image_size, layout, device, dtype)
