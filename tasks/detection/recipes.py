"""DALI recipes for detection. They know nothing of torch or TensorFlow.

Every recipe reads its `source` (a CocoSource: an image folder, its COCO annotation file and this
replica's shard) through `fn.readers.coco` named "Reader", boxes as ltrb relative to the image
(`ratio=True`), labels 1..K in the file's category order (0 is the background). It encodes the boxes
with `fn.box_encoder` against the model's `anchors` (hydrali.tasks.detection.anchors), so the batch
carries per-anchor targets, and returns:

- training:   (images, targets)
- validation: (images, targets, image_ids)

images normalised in `layout` (CHW for torch, HWC for Keras); targets float32 [N, 5] per image: the
anchor's encoded box offsets (4 values) and its label (as a float); image_ids int32 [1], the file's
image id (validation scores against the annotation file, which also gives each image's size); layout.py
names these outputs and their columns.
`device="cpu"` uses CPU operators only; `device="gpu"` decodes with the mixed decoder and moves every
output to the GPU. A recipe's own options are its keyword-only parameters (`pipeline.options`).
"""

from __future__ import annotations

from dataclasses import dataclass

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
from nvidia.dali import pipeline_def

from hydrali.core.data.pipelines import Source, decoder_args
from hydrali.core.data.webdataset import ShardSource
from hydrali.tasks.detection import sharded
from hydrali.tasks.detection.anchors import box_encoder_args
from hydrali.tasks.detection.layout import TARGET_COLUMN_AXIS
from hydrali.tasks.recipe_steps import decode, normalize, on_device

CROP_ATTEMPTS = 50  # random_bbox_crop: windows tried per image before the whole image is taken


@dataclass(frozen=True)
class CocoSource(Source):
    """A Source whose `root` is an image folder described by a COCO annotation file."""

    annotation_file: str = ""


def read_coco(source: CocoSource | ShardSource, initial_fill: int):
    """The sharded COCO reader every recipe starts with: (encoded images, ltrb boxes in [0, 1], labels
    1..K, and in validation image ids), named "Reader". Training skips images without boxes. A ShardSource reads
    the same from tar shards (tasks/detection/sharded.py), whose train split holds no image without boxes."""
    if isinstance(source, ShardSource):
        return _read_shards(source, initial_fill)
    outputs = fn.readers.coco(
        file_root=source.root,
        annotations_file=source.annotation_file,
        ltrb=True,
        ratio=True,
        skip_empty=source.is_training,
        image_ids=not source.is_training,
        initial_fill=initial_fill,
        **source.reader_args(),
    )
    jpegs, boxes, labels = outputs[:3]
    # readers.coco does not clip, and random_bbox_crop asserts on a box a rounding error outside [0, 1]
    boxes = dmath.clamp(boxes, 0.0, 1.0)
    return (jpegs, boxes, labels, *outputs[3:])


def _read_shards(source: ShardSource, initial_fill: int):
    """read_coco's outputs from WebDataset shards: the same shapes and types as fn.readers.coco's."""
    jpegs, boxes, labels, image_ids = fn.readers.webdataset(
        ext=[sharded.IMAGE, sharded.BOXES, sharded.LABELS, sharded.IMAGE_ID],
        dtypes=[types.UINT8, types.FLOAT, types.INT32, types.INT32],
        initial_fill=initial_fill,
        **source.webdataset_args(),
    )
    boxes = dmath.clamp(fn.reshape(boxes, shape=[-1, 4]), 0.0, 1.0)
    return (jpegs, boxes, labels) if source.is_training else (jpegs, boxes, labels, image_ids)


def encode_targets(boxes, labels, anchors, device):
    """Per-anchor targets [N, 5] float32 (box offsets, then the label) of one image's boxes and labels."""
    offsets, anchor_labels = fn.box_encoder(boxes, labels, **box_encoder_args(anchors))
    label_column = fn.expand_dims(fn.cast(anchor_labels, dtype=types.FLOAT), axes=[TARGET_COLUMN_AXIS])
    return on_device(fn.cat(offsets, label_column, axis=TARGET_COLUMN_AXIS), device)


def _validation(source, device, layout, image_size, dtype, hw_decoder_load, anchors, mean, std, initial_fill):
    """Decode, resize to image_size x image_size, normalize; targets and image ids."""
    jpegs, boxes, labels, image_ids = read_coco(source, initial_fill)
    images = decode(jpegs, device, hw_decoder_load)
    images = fn.resize(images, resize_x=image_size, resize_y=image_size)
    images = normalize(images, image_size, layout, mean, std, dtype)
    image_ids = fn.cast(image_ids, dtype=types.INT32)
    return images, encode_targets(boxes, labels, anchors, device), on_device(image_ids, device)


def _flip(boxes, flip_probability):
    """A per-image mirror flag and the boxes mirrored with it."""
    mirror = fn.random.coin_flip(probability=flip_probability)
    return mirror, fn.bb_flip(boxes, ltrb=True, horizontal=mirror)


@pipeline_def
def ssd(
    source,
    device,
    layout,
    image_size,
    dtype,
    hw_decoder_load,
    anchors,
    *,
    crop_thresholds,
    crop_aspect_ratio,
    crop_scaling,
    hue,
    saturation,
    brightness,
    contrast,
    flip_probability,
    mean,
    std,
    initial_fill,
):
    """Training: a random crop keeping some IoU with a box (CPU), decode of that window only, resize, colour
    jitter, random flip, normalize, box encoding. Validation: decode, resize, normalize."""
    if not source.is_training:
        return _validation(source, device, layout, image_size, dtype, hw_decoder_load, anchors, mean, std, initial_fill)
    jpegs, boxes, labels = read_coco(source, initial_fill)
    crop_begin, crop_size, boxes, labels = fn.random_bbox_crop(
        boxes,
        labels,
        device="cpu",
        aspect_ratio=crop_aspect_ratio,
        thresholds=crop_thresholds,
        scaling=crop_scaling,
        bbox_layout="xyXY",
        allow_no_crop=True,
        num_attempts=CROP_ATTEMPTS,
    )
    images = fn.decoders.image_slice(
        jpegs, crop_begin, crop_size, output_type=types.RGB, **decoder_args(device, hw_decoder_load)
    )
    images = fn.resize(images, resize_x=image_size, resize_y=image_size)
    images = fn.hsv(images, hue=fn.random.uniform(range=hue), saturation=fn.random.uniform(range=saturation))
    images = fn.brightness_contrast(
        images, brightness=fn.random.uniform(range=brightness), contrast=fn.random.uniform(range=contrast)
    )
    mirror, boxes = _flip(boxes, flip_probability)
    images = normalize(images, image_size, layout, mean, std, dtype, mirror)
    return images, encode_targets(boxes, labels, anchors, device)


@pipeline_def
def scale_jitter(
    source,
    device,
    layout,
    image_size,
    dtype,
    hw_decoder_load,
    anchors,
    *,
    scale,
    flip_probability,
    mean,
    std,
    initial_fill,
):
    """Training: decode, a random square-ish window of `scale` times the image's side (padded where it leaves
    the image), resize, random flip, normalize, box encoding. Validation: decode, resize, normalize."""
    if not source.is_training:
        return _validation(source, device, layout, image_size, dtype, hw_decoder_load, anchors, mean, std, initial_fill)
    jpegs, boxes, labels = read_coco(source, initial_fill)
    images = decode(jpegs, device, hw_decoder_load)
    crop_begin, crop_size, boxes, labels = fn.random_bbox_crop(
        boxes,
        labels,
        device="cpu",
        aspect_ratio=[1.0, 1.0],
        thresholds=[0.0],
        scaling=scale,
        bbox_layout="xyXY",
        allow_no_crop=False,
        num_attempts=CROP_ATTEMPTS,
    )
    images = fn.slice(images, crop_begin, crop_size, out_of_bounds_policy="pad")
    images = fn.resize(images, resize_x=image_size, resize_y=image_size)
    mirror, boxes = _flip(boxes, flip_probability)
    images = normalize(images, image_size, layout, mean, std, dtype, mirror)
    return images, encode_targets(boxes, labels, anchors, device)
