"""An SSD-style detector in PyTorch: the classification ResNet as backbone, one box head and one class
head (3x3 convolutions) per feature level, one output tensor per batch.

The Keras model (keras_model.py) builds the same network; both follow the anchor order contract of
anchors.py, so that `raw[..., :4]` decodes against `default_boxes(model.anchor_spec)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from hydrali.tasks.classification.torch_model import ResNet
from hydrali.tasks.detection.anchors import DEFAULT_STRIDES, AnchorSpec, anchor_spec, num_anchors, num_anchors_per_cell
from hydrali.tasks.detection.layout import BOX_VALUES, logits_per_anchor

HEAD_KERNEL = 3  # both heads: one 3x3 convolution, "same" padding, stride 1, with bias
BACKBONE_CLASSES = 1  # the ResNet's classifier is built, then dropped: its size does not matter


def _feature_stages(offered: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """The backbone stage of each requested stride, in the order of `strides` (ValueError if a stride
    is produced by no stage)."""
    missing = [s for s in strides if s not in offered]
    if missing:
        raise ValueError(
            f"model.anchors.strides={list(strides)}: no backbone stage has stride "
            f"{', '.join(map(str, missing))}; this backbone offers {list(offered)}"
        )
    return tuple(offered.index(s) for s in strides)


def _truncated_backbone(resnet: ResNet, num_stages: int) -> ResNet:
    """The ResNet cut after its num_stages-th stage, without its classifier (in place). Layers past the
    last feature level would hold parameters that get no gradient (DistributedDataParallel refuses
    them) and that the Keras model, built from its input to the feature levels, does not have."""
    resnet.stages = resnet.stages[:num_stages]
    resnet.head = nn.Identity()
    return resnet


def _head(cin: int, cout: int, zero_bias: bool = False) -> nn.Conv2d:
    """One head convolution: 3x3, same padding, stride 1, with bias (framework-default initialisation)."""
    conv = nn.Conv2d(cin, cout, HEAD_KERNEL, stride=1, padding=HEAD_KERNEL // 2, bias=True)
    if zero_bias:
        nn.init.zeros_(conv.bias)
    return conv


def _flatten_level(out: torch.Tensor, values_per_anchor: int) -> torch.Tensor:
    """[B, A * k, f, f] head output (channel a * k + j) -> [B, f * f * A, k] in anchor order."""
    return out.permute(0, 2, 3, 1).reshape(out.shape[0], -1, values_per_anchor)


class SSD(nn.Module):
    """A single-shot detector: forward(x [B, 3, S, S] float) -> raw [B, N, 4 + C], C = num_classes + 1.

    raw[..., :4] are box offsets (DALI box_encoder coding) and raw[..., 4:] class logits (index 0 =
    background), one row per anchor of `default_boxes(self.anchor_spec)`, in its order.

    num_classes: K foreground classes. image_size: S (square inputs). block, layers, widths, stem: the
    backbone, as for the classification ResNet. anchors: a model config's anchors node (strides,
    min_scale, max_scale, aspect_ratios); the feature levels are the backbone stages whose stride is
    in anchors["strides"], in that order.
    """

    def __init__(
        self,
        num_classes: int,
        image_size: int,
        block: str = "basic",
        layers: Sequence[int] = (1, 1, 1, 1),
        widths: Sequence[int] = (32, 64, 128, 256),
        stem: str = "imagenet",
        anchors: Mapping | None = None,
    ):
        super().__init__()
        anchors = {"strides": list(DEFAULT_STRIDES)} if anchors is None else anchors
        resnet = ResNet(BACKBONE_CLASSES, block, layers, widths, stem)
        self.level_stages = _feature_stages(resnet.stage_strides(), [int(s) for s in anchors["strides"]])
        self.anchor_spec: AnchorSpec = anchor_spec(image_size, anchors)
        self.image_size = int(image_size)
        self.num_classes = int(num_classes)
        self.backbone = _truncated_backbone(resnet, max(self.level_stages) + 1)
        channels = self.backbone.stage_channels()
        per_cell = num_anchors_per_cell(self.anchor_spec)
        self.loc_heads = nn.ModuleList(_head(channels[i], a * BOX_VALUES) for i, a in zip(self.level_stages, per_cell))
        self.cls_heads = nn.ModuleList(
            _head(channels[i], a * self.num_outputs_per_anchor, zero_bias=True)
            for i, a in zip(self.level_stages, per_cell)
        )

    @property
    def num_outputs_per_anchor(self) -> int:
        """C = K + 1: the class logits per anchor, background (index 0) included."""
        return logits_per_anchor(self.num_classes)

    @property
    def num_anchors(self) -> int:
        """N: the rows of the output (anchors of all levels)."""
        return num_anchors(self.anchor_spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """raw [B, N, 4 + C] for images x [B, 3, S, S] (S = image_size)."""
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(
                f"SSD: expected images of {self.image_size}x{self.image_size} (data.image_size), "
                f"got {tuple(x.shape[-2:])}: the anchors would not match the feature maps"
            )
        stages = self.backbone.features(x)
        locs, logits = [], []
        for stage, loc_head, cls_head in zip(self.level_stages, self.loc_heads, self.cls_heads):
            locs.append(_flatten_level(loc_head(stages[stage]), BOX_VALUES))
            logits.append(_flatten_level(cls_head(stages[stage]), self.num_outputs_per_anchor))
        return torch.cat([torch.cat(locs, dim=1), torch.cat(logits, dim=1)], dim=-1)
