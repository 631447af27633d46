"""ResNets in Keras 3: the same architectures as torch_model.py, and keras.applications' ResNet50."""

from __future__ import annotations

from typing import Sequence

import keras
from keras import layers as kl

from hydrali.tasks.classification.layouts import (
    check_applications_resnet50,
    check_resnet,
    check_resnet9,
    check_resnet9_image_side,
)

BN = {"momentum": 0.9, "epsilon": 1e-5}  # torch's BatchNorm2d defaults, in Keras' terms


def _conv_bn(x, filters: int, kernel: int, stride: int = 1, zero_gamma: bool = False):
    x = kl.Conv2D(
        filters, kernel, stride, padding="same", use_bias=False, kernel_initializer=keras.initializers.HeNormal()
    )(x)
    return kl.BatchNormalization(gamma_initializer="zeros" if zero_gamma else "ones", **BN)(x)


def _shortcut(x, cout: int, stride: int, kind: str):
    """torch_model._shortcut's: the identity, a strided 1x1 convolution, or (ResNet-D) an average pool over each
    stride x stride window, windows cut by an odd side averaging what they hold, then a 1x1 convolution."""
    if stride == 1 and x.shape[-1] == cout:
        return x
    if kind == "avgpool" and stride > 1:
        return _conv_bn(kl.AveragePooling2D(stride, stride, padding="same")(x), cout, 1)
    return _conv_bn(x, cout, 1, stride)


def _block(x, width: int, stride: int, bottleneck: bool, shortcut: str = "conv"):
    expansion = 4 if bottleneck else 1
    cout = width * expansion
    if bottleneck:
        y = kl.ReLU()(_conv_bn(x, width, 1))
        y = kl.ReLU()(_conv_bn(y, width, 3, stride))
        y = _conv_bn(y, cout, 1, zero_gamma=True)
    else:
        y = kl.ReLU()(_conv_bn(x, width, 3, stride))
        y = _conv_bn(y, cout, 3, zero_gamma=True)
    return kl.ReLU()(kl.Add()([y, _shortcut(x, cout, stride, shortcut)]))


def _stem(inputs, stem: str, width: int):
    """torch_model._stem's layers: 7x7/2 + max-pool (imagenet), three 3x3 the first /2 + max-pool (deep), 3x3."""
    if stem == "imagenet":
        return kl.MaxPooling2D(3, 2, padding="same")(kl.ReLU()(_conv_bn(inputs, width, 7, 2)))
    if stem == "deep":
        x = kl.ReLU()(_conv_bn(inputs, width // 2, 3, 2))
        x = kl.ReLU()(_conv_bn(x, width // 2, 3))
        return kl.MaxPooling2D(3, 2, padding="same")(kl.ReLU()(_conv_bn(x, width, 3)))
    return kl.ReLU()(_conv_bn(inputs, width, 3))


def resnet_features(
    inputs,
    block: str = "basic",
    layers: Sequence[int] = (2, 2, 2, 2),
    widths: Sequence[int] = (64, 128, 256, 512),
    stem: str = "imagenet",
    shortcut: str = "conv",
) -> list:
    """The output of each stage of the ResNet's backbone (stem and residual stages, no head) applied to the
    NHWC tensor `inputs`, first stage first: stage i has stride 4 * 2**i with stems "imagenet" and "deep", 2**i
    with stem "small". The layers are those `ResNet` builds, in the same order (same names and weights).
    """
    depths = layers
    check_resnet(block, depths, widths, stem, shortcut)
    x = _stem(inputs, stem, widths[0])
    features = []
    for i, (depth, width) in enumerate(zip(depths, widths)):
        for j in range(depth):
            x = _block(x, width, 2 if (j == 0 and i > 0) else 1, block == "bottleneck", shortcut)
        features.append(x)
    return features


def ResNet(
    num_classes: int,
    image_size: int | None,
    block: str = "basic",
    layers: Sequence[int] = (2, 2, 2, 2),
    widths: Sequence[int] = (64, 128, 256, 512),
    stem: str = "imagenet",
    shortcut: str = "conv",
) -> keras.Model:
    """A ResNet as a functional Keras model, taking NHWC images of image_size x image_size (None: of any side).

    Same arguments as hydrali.tasks.classification.torch_model.ResNet.
    """
    check_resnet(block, layers, widths, stem, shortcut)
    inputs = keras.Input((image_size, image_size, 3))
    x = resnet_features(inputs, block, layers, widths, stem, shortcut)[-1]
    x = kl.GlobalAveragePooling2D()(x)
    outputs = kl.Dense(num_classes)(x)  # logits, as on torch
    return keras.Model(inputs, outputs, name="resnet")


def ResNet50(num_classes: int, image_size: int | None, **architecture) -> keras.Model:
    """keras.applications.ResNet50, randomly initialised, with a logits head of num_classes, taking images of
    image_size x image_size (None: of any side).

    `architecture` (block, layers, widths, stem, shortcut from conf/model/resnet50.yaml) describes this same
    network for the torch side; a variant keras.applications does not build (another stem or shortcut) is refused.
    """
    check_applications_resnet50(architecture.get("stem", "imagenet"), architecture.get("shortcut", "conv"))
    if image_size is not None:
        return keras.applications.ResNet50(
            weights=None, input_shape=(image_size, image_size, 3), classes=num_classes, classifier_activation=None
        )
    # any side (progressive_resizing): Keras builds the classifier only for a fixed side; the same layers, named so
    features = keras.applications.ResNet50(weights=None, include_top=False, input_shape=(None, None, 3), pooling="avg")
    outputs = kl.Dense(num_classes, name="predictions")(features.output)
    return keras.Model(features.input, outputs, name=features.name)


# torch's default initialisation of convolution and linear weights, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), in Keras' terms
TORCH_DEFAULT_INIT = {"scale": 1.0 / 3.0, "mode": "fan_in", "distribution": "uniform"}


def _conv_bn_relu(x, filters: int):
    x = kl.Conv2D(
        filters,
        3,
        padding="same",
        use_bias=False,
        kernel_initializer=keras.initializers.VarianceScaling(**TORCH_DEFAULT_INIT),
    )(x)
    return kl.ReLU()(kl.BatchNormalization(**BN)(x))


def ResNet9(
    num_classes: int,
    image_size: int | None,
    widths: Sequence[int] = (64, 128, 256, 512),
    layers: Sequence[int] = (1, 0, 1),
    head_scale: float = 0.125,
) -> keras.Model:
    """Page's ResNet-9 as a functional Keras model taking NHWC images of image_size x image_size (None: of any side,
    8 px and up with its 3 stages): the same network,
    layer for layer and with the same initialisation, as hydrali.tasks.classification.torch_model.ResNet9."""
    check_resnet9(widths, layers)
    if image_size is not None:  # None: any side (progressive_resizing), 8 px and up with 3 stages (not checked)
        check_resnet9_image_side(image_size, layers)
    inputs = keras.Input((image_size, image_size, 3))
    x = _conv_bn_relu(inputs, widths[0])
    for width, depth in zip(widths[1:], layers):
        x = kl.MaxPooling2D(2)(_conv_bn_relu(x, width))
        for _ in range(depth):
            x = kl.Add()([x, _conv_bn_relu(_conv_bn_relu(x, width), width)])
    x = kl.GlobalMaxPooling2D()(x)
    x = kl.Dense(
        num_classes, use_bias=False, kernel_initializer=keras.initializers.VarianceScaling(**TORCH_DEFAULT_INIT)
    )(x)
    outputs = kl.Rescaling(head_scale)(x)  # logits, as on torch
    return keras.Model(inputs, outputs, name="resnet9")
