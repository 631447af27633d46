"""ResNets in PyTorch: the standard ResNet-18/50 layout and small variants for small images.

Written here rather than taken from torchvision, which does not load with every torch build.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut (ResNet-18/34)."""
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(*_conv_bn(cin, width, 3, stride), nn.ReLU(inplace=True), *_conv_bn(width, cout, 3))
        self.shortcut = (nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout
                         else nn.Identity())
        nn.init.zeros_(self.body[-1].weight)  # start each block as the identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class Bottleneck(BasicBlock):
    """1x1 -> 3x3 -> 1x1 convolutions with a shortcut, 4x expansion (ResNet-50/101/152)."""
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        nn.Module.__init__(self)
        cout = width * self.expansion
        self.body = nn.Sequential(*_conv_bn(cin, width, 1), nn.ReLU(inplace=True),
                                  *_conv_bn(width, width, 3, stride), nn.ReLU(inplace=True),
                                  *_conv_bn(width, cout, 1))
        self.shortcut = (nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout
                         else nn.Identity())
        nn.init.zeros_(self.body[-1].weight)


BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet(nn.Module):
    """A ResNet: stem, stages of residual blocks (each after the first halves the resolution), pooled head."""

    def __init__(self, num_classes: int, block: str = "basic", layers: Sequence[int] = (2, 2, 2, 2),
                 widths: Sequence[int] = (64, 128, 256, 512), stem: str = "imagenet", in_channels: int = 3):
        super().__init__()
        if block not in BLOCKS:
            raise ValueError(f"model.block={block!r}: choose one of {', '.join(BLOCKS)}")
        if len(layers) != len(widths):
            raise ValueError(f"model.layers ({len(layers)} stages) and model.widths ({len(widths)}) differ in length")
        if stem == "imagenet":
            self.stem = nn.Sequential(*_conv_bn(in_channels, widths[0], 7, 2), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(3, 2, 1))
        elif stem == "small":
            self.stem = nn.Sequential(*_conv_bn(in_channels, widths[0], 3), nn.ReLU(inplace=True))
        else:
            raise ValueError(f"model.stem={stem!r}: choose imagenet or small")
        kind = BLOCKS[block]
        stages, cin = [], widths[0]
        for i, (depth, width) in enumerate(zip(layers, widths)):
            blocks = []
            for j in range(depth):
                blocks.append(kind(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * kind.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))
