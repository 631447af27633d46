"""Checks of network layouts that both frameworks' builders share (no framework imported here)."""

from __future__ import annotations

from typing import Any, Sequence

from hydrali.core.errors import HydraliError

# The ResNets' layouts (torch_model.ResNet, keras_model.ResNet). The stem's downsampling: 7x7/2 conv + 3x3/2 max-pool
# (imagenet); three 3x3 convs, the first /2, + 3x3/2 max-pool (deep: ResNet-C, He et al. 2019, "Bag of Tricks");
# a 3x3/1 conv (small)
STEM_STRIDES = {"imagenet": 4, "deep": 4, "small": 1}
# a downsampling block's shortcut: a 1x1/2 conv (conv), or a 2x2/2 average pool then a 1x1 conv (avgpool: ResNet-D)
SHORTCUTS = ("conv", "avgpool")
STAGE_STRIDE = 2  # every stage after the first halves the resolution


def stage_strides(stem: str, num_stages: int) -> tuple[int, ...]:
    """The stride (input pixels per feature-map pixel) of each stage's output of a ResNet with this stem:
    4, 8, 16, 32 ... for stems "imagenet" and "deep"; 1, 2, 4, 8 ... for stem "small"."""
    if stem not in STEM_STRIDES:
        raise ValueError(f"model.stem={stem!r}: choose {' or '.join(STEM_STRIDES)}")
    return tuple(STEM_STRIDES[stem] * STAGE_STRIDE**i for i in range(num_stages))


def check_resnet(block: str, depths: Sequence[int], widths: Sequence[int], stem: str, shortcut: str) -> None:
    """Fail (ValueError, naming the option) for a ResNet layout neither framework builds."""
    if block not in ("basic", "bottleneck"):
        raise ValueError(f"model.block={block!r}: choose basic or bottleneck")
    if len(depths) != len(widths):
        raise ValueError(
            f"model.layers ({len(depths)} stages) and model.widths ({len(widths)}) differ in length: give both the"
            " same number of stages"
        )
    stage_strides(stem, len(widths))
    if shortcut not in SHORTCUTS:
        raise ValueError(f"model.shortcut={shortcut!r}: choose {' or '.join(SHORTCUTS)}")


def check_resnet_config(model: Any) -> None:
    """Fail in one line (HydraliError, naming the options) for a ResNet model config (`model.*`) neither framework
    builds: checked before the run dir is touched (TaskSpec.network_checks)."""
    try:
        check_resnet(
            model.get("block", "basic"),
            list(model.layers),
            list(model.widths),
            model.get("stem", "imagenet"),
            model.get("shortcut", "conv"),
        )
    except ValueError as err:
        raise HydraliError(str(err)) from None


def check_resnet9_config(model: Any) -> None:
    """check_resnet_config for model=resnet9's config."""
    try:
        check_resnet9(list(model.widths), list(model.layers))
    except ValueError as err:
        raise HydraliError(str(err)) from None


def check_applications_resnet50(stem: str, shortcut: str) -> None:
    """Fail (ValueError, naming the fix) for a ResNet-50 variant keras.applications' ResNet50 does not build: it has
    the 7x7 stem and strided 1x1 shortcuts alone."""
    variant = {"stem": stem, "shortcut": shortcut}
    if variant != {"stem": "imagenet", "shortcut": "conv"}:
        raise ValueError(
            f"keras.applications' ResNet50 has the 7x7 stem and strided 1x1 shortcuts, not {variant}: pass "
            f"model.keras_target=hydrali.tasks.classification.keras_model.ResNet for the variant on Keras"
        )


def check_applications_resnet50_config(model: Any) -> None:
    """check_resnet_config for model=resnet50 on Keras (keras.applications' network)."""
    try:
        check_applications_resnet50(model.get("stem", "imagenet"), model.get("shortcut", "conv"))
    except ValueError as err:
        raise HydraliError(str(err)) from None


def check_resnet9(widths: Sequence[int], layers: Sequence[int]) -> None:
    """Fail, naming the options, unless `widths` has one entry more than `layers` (the first convolution's, then
    each stage's) and every stage has zero or more residual pairs."""
    if len(widths) != len(layers) + 1:
        raise HydraliError(
            f"model.widths ({len(widths)} entries) must have one more than model.layers ({len(layers)} stages): "
            "the first convolution's channels, then each stage's"
        )
    if any(depth < 0 for depth in layers):
        raise HydraliError(f"model.layers={list(layers)}: each stage's residual pairs are 0 or more")


def resnet9_smallest_side(layers: Sequence[int]) -> int:
    """The smallest image side ResNet-9 with these stages takes: each stage's 2x2 max-pool halves it."""
    return 2 ** len(layers)


def check_resnet9_image_side(side: int, layers: Sequence[int], at_step: bool = False) -> None:
    """Fail, naming the options, when images of `side` pixels are too small for the stages' max-pools: data.image_size
    when building, or (`at_step`) a training step's images, which progressive_resizing may have scaled down."""
    smallest = resnet9_smallest_side(layers)
    if side < smallest:
        what, options = (
            (f"images of {side} px", "data.image_size or progressive_resizing.start_side")
            if at_step
            else (f"data.image_size={side}", "data.image_size")
        )
        raise HydraliError(
            f"{what}: model=resnet9 with {len(layers)} stages (model.layers={list(layers)}) takes "
            f"images of {smallest} px and up (each stage halves them): raise {options} or pass fewer stages"
        )
