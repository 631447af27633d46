"""The SSD-style detector in Keras 3: the classification ResNet's stages as feature levels, with a box head
and a class head per level (the same network as the torch side; see tasks/detection/anchors.py for the
anchor order and the box coding the heads follow)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import keras
from keras import layers as kl

from hydrali.tasks.classification.keras_model import resnet_features
from hydrali.tasks.classification.layouts import stage_strides
from hydrali.tasks.detection.anchors import DEFAULT_STRIDES, AnchorSpec, anchor_spec, num_anchors_per_cell
from hydrali.tasks.detection.layout import BOX_VALUES, logits_per_anchor

HEAD_KERNEL = 3  # each head is one HEAD_KERNEL x HEAD_KERNEL convolution, "same" padding, stride 1


def feature_stages(strides: Sequence[int], stem: str, num_stages: int) -> list[int]:
    """The index of the backbone stage producing each of `strides` (model.anchors.strides), in that order."""
    offered = stage_strides(stem, num_stages)
    missing = [s for s in strides if s not in offered]
    if missing:
        raise ValueError(
            f"model.anchors.strides={list(strides)}: no backbone stage has stride "
            f"{', '.join(map(str, missing))}; this backbone (stem {stem}, {num_stages} stages) offers "
            f"strides {', '.join(map(str, offered))}"
        )
    return [offered.index(s) for s in strides]


def _level_head(feature, level: int, anchors: int, values: int, kind: str):
    """One head's per-anchor outputs [B, f * f * anchors, values] of one level (anchor order of anchors.py)."""
    out = kl.Conv2D(
        anchors * values,
        HEAD_KERNEL,
        padding="same",
        use_bias=True,
        bias_initializer="zeros",
        name=f"{kind}_head_{level}",
    )(feature)
    return kl.Reshape((-1, values), name=f"{kind}_reshape_{level}")(out)


def _check_feature_sizes(features: list, spec: AnchorSpec) -> None:
    sizes = tuple(int(f.shape[1]) for f in features)
    if sizes != spec.feature_sizes:
        raise ValueError(
            f"the backbone's feature levels are {sizes} cells wide, the anchors expect "
            f"{spec.feature_sizes}: check model.anchors.strides and data.image_size"
        )


def SSD(
    num_classes: int,
    image_size: int,
    block: str = "basic",
    layers: Sequence[int] = (1, 1, 1, 1),
    widths: Sequence[int] = (32, 64, 128, 256),
    stem: str = "imagenet",
    anchors: Mapping | None = None,
) -> keras.Model:
    """An SSD-style detector as a functional Keras model: NHWC images of image_size x image_size in, one float32
    tensor [B, N, 4 + 1 + num_classes] out: per anchor (in the order of anchors.default_boxes), 4 box offsets
    (DALI box_encoder coding) then the logits of background and the num_classes classes.

    block, layers, widths, stem: the backbone, as for the classification ResNet; anchors: the model config's
    `anchors` node (strides, min_scale, max_scale, aspect_ratios), strides (8, 16, 32) by default.
    """
    anchors = {"strides": DEFAULT_STRIDES} if anchors is None else anchors
    if len(layers) != len(widths):
        raise ValueError(f"model.layers ({len(layers)} stages) and model.widths ({len(widths)}) differ in length")
    stages = feature_stages([int(s) for s in anchors["strides"]], stem, len(layers))
    spec = anchor_spec(image_size, anchors)
    classes = logits_per_anchor(num_classes)
    inputs = keras.Input((image_size, image_size, 3))
    used = max(stages) + 1  # stages past the last feature level are not built (as on torch)
    stage_outputs = resnet_features(inputs, block, list(layers)[:used], list(widths)[:used], stem)
    features = [stage_outputs[i] for i in stages]
    _check_feature_sizes(features, spec)
    per_cell = num_anchors_per_cell(spec)
    loc = [_level_head(f, level, a, BOX_VALUES, "loc") for level, (f, a) in enumerate(zip(features, per_cell))]
    logits = [_level_head(f, level, a, classes, "class") for level, (f, a) in enumerate(zip(features, per_cell))]
    loc = kl.Concatenate(axis=1, name="loc")(loc) if len(loc) > 1 else loc[0]
    logits = kl.Concatenate(axis=1, name="logits")(logits) if len(logits) > 1 else logits[0]
    outputs = kl.Concatenate(axis=-1, dtype="float32", name="raw")([loc, logits])  # float32 under mixed precision
    return keras.Model(inputs, outputs, name="ssd")
