"""ResNets in PyTorch: the standard ResNet-18/50 layout and small variants for small images.

Written here rather than taken from torchvision, which does not load with every torch build.
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch
from torch import nn

from hydrali.tasks.classification.layouts import (
    STAGE_STRIDE,
    check_resnet,
    check_resnet9,
    check_resnet9_image_side,
    resnet9_smallest_side,
    stage_strides,
)


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]


def _shortcut(cin: int, cout: int, stride: int, kind: str) -> nn.Module:
    """A block's shortcut: the identity where shapes match, else a 1x1 convolution (and BatchNorm) that strides
    (`kind` conv) or follows an average pool over each stride x stride window (`kind` avgpool: ResNet-D, which sees
    every input pixel; windows cut by an odd side average what they hold)."""
    if stride == 1 and cin == cout:
        return nn.Identity()
    if kind == "avgpool" and stride > 1:
        pool = nn.AvgPool2d(stride, stride, ceil_mode=True, count_include_pad=False)
        return nn.Sequential(pool, *_conv_bn(cin, cout, 1))
    return nn.Sequential(*_conv_bn(cin, cout, 1, stride))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int, shortcut: str = "conv"):
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(*_conv_bn(cin, width, 3, stride), nn.ReLU(inplace=True), *_conv_bn(width, cout, 3))
        self.shortcut = _shortcut(cin, cout, stride, shortcut)
        nn.init.zeros_(self.body[-1].weight)  # start each block as the identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class Bottleneck(BasicBlock):
    """1x1 -> 3x3 -> 1x1 convolutions with a shortcut, 4x expansion (ResNet-50/101/152)."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int, shortcut: str = "conv"):
        nn.Module.__init__(self)
        cout = width * self.expansion
        self.body = nn.Sequential(
            *_conv_bn(cin, width, 1),
            nn.ReLU(inplace=True),
            *_conv_bn(width, width, 3, stride),
            nn.ReLU(inplace=True),
            *_conv_bn(width, cout, 1),
        )
        self.shortcut = _shortcut(cin, cout, stride, shortcut)
        nn.init.zeros_(self.body[-1].weight)


BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


def _stem(stem: str, cin: int, width: int) -> nn.Sequential:
    """The layers before the first stage (layouts.STEM_STRIDES), giving `width` channels."""
    relu = functools.partial(nn.ReLU, inplace=True)
    if stem == "imagenet":
        return nn.Sequential(*_conv_bn(cin, width, 7, 2), relu(), nn.MaxPool2d(3, 2, 1))
    if stem == "deep":  # ResNet-C: the 7x7 convolution's field of view from three 3x3 ones, half the width first
        half = width // 2
        convs = [*_conv_bn(cin, half, 3, 2), relu(), *_conv_bn(half, half, 3), relu(), *_conv_bn(half, width, 3)]
        return nn.Sequential(*convs, relu(), nn.MaxPool2d(3, 2, 1))
    return nn.Sequential(*_conv_bn(cin, width, 3), relu())


class ResNet(nn.Module):
    """A ResNet: stem, stages of residual blocks (each after the first halves the resolution), pooled head.
    `stem` and `shortcut` (layouts.STEM_STRIDES, layouts.SHORTCUTS) choose the ResNet-C/D variants of Bag of
    Tricks (He et al. 2019): stem="deep" shortcut="avgpool" is timm's resnet*d layout.

    `features(x)` gives the output of every stage (the feature maps a detector builds on), and
    `stage_strides()` / `stage_channels()` their strides and channel counts.
    """

    def __init__(
        self,
        num_classes: int,
        block: str = "basic",
        layers: Sequence[int] = (2, 2, 2, 2),
        widths: Sequence[int] = (64, 128, 256, 512),
        stem: str = "imagenet",
        in_channels: int = 3,
        shortcut: str = "conv",
    ):
        super().__init__()
        check_resnet(block, layers, widths, stem, shortcut)
        self.stem = _stem(stem, in_channels, widths[0])
        kind = BLOCKS[block]
        stages, cin = [], widths[0]
        for i, (depth, width) in enumerate(zip(layers, widths)):
            blocks = []
            for j in range(depth):
                blocks.append(kind(cin, width, STAGE_STRIDE if (j == 0 and i > 0) else 1, shortcut))
                cin = width * kind.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self._stem = stem  # plain attributes (not in the state_dict), for stage_strides / stage_channels
        self._channels = tuple(int(w) * kind.expansion for w in widths)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The output of every stage, finest first: [B, stage_channels()[i], H / s_i, W / s_i] with
        s_i = stage_strides()[i] (for H and W multiples of the largest stride). Nothing of the head runs."""
        outputs, x = [], self.stem(x)
        for stage in self.stages:
            x = stage(x)
            outputs.append(x)
        return outputs

    def stage_strides(self) -> tuple[int, ...]:
        """The stride of each stage's output (layouts.stage_strides)."""
        return stage_strides(self._stem, len(self.stages))

    def stage_channels(self) -> tuple[int, ...]:
        """The channel count of each stage's output (width times the block's expansion)."""
        return self._channels[: len(self.stages)]


def _conv_bn_relu(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class ResidualPair(nn.Module):
    """Two 3x3 convolution-norm-ReLU layers added to their input (ResNet-9's residual block)."""

    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(_conv_bn_relu(channels, channels), _conv_bn_relu(channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class Scale(nn.Module):
    """Multiplies its input by a constant."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class ResNet9(nn.Module):
    """David Page's ResNet-9 for small photos (DAWNBench 2018, 94% on CIFAR-10 in 24 epochs): a 3x3 convolution,
    then stages of a 3x3 convolution and a 2x2 max-pool followed by residual pairs, a global max-pool and a bias-free
    linear layer whose logits are scaled by `head_scale`. Layers keep torch's default initialisation.

    `widths` holds the first convolution's channels then each stage's; `layers` the residual pairs of each stage.
    """

    def __init__(
        self,
        num_classes: int,
        widths: Sequence[int] = (64, 128, 256, 512),
        layers: Sequence[int] = (1, 0, 1),
        head_scale: float = 0.125,
        in_channels: int = 3,
    ):
        super().__init__()
        check_resnet9(widths, layers)
        self._layers = tuple(layers)  # plain attributes (not in the state_dict), for the image size check
        self._smallest_side = resnet9_smallest_side(layers)
        self.stem = _conv_bn_relu(in_channels, widths[0])
        stages = []
        for cin, width, depth in zip(widths[:-1], widths[1:], layers):
            stages.append(
                nn.Sequential(_conv_bn_relu(cin, width), nn.MaxPool2d(2), *[ResidualPair(width) for _ in range(depth)])
            )
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(
            nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(widths[-1], num_classes, bias=False), Scale(head_scale)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if min(x.shape[-2:]) < self._smallest_side:  # torch's pooling would fail deep inside, with a traceback
            check_resnet9_image_side(min(x.shape[-2:]), self._layers, at_step=True)
        return self.head(self.stages(self.stem(x)))
