"""model=timm on Keras: timm's networks that keras-hub can convert (ResNets, EfficientNets, MobileNets, DenseNets,
VGGs, CSPNets, HGNetV2), from random weights, timm's pretrained weights (the same files timm reads) or a local copy
of them (conf/model/timm.yaml). keras-hub is imported only when such a model is built."""

from __future__ import annotations

from pathlib import Path

import keras
from keras import layers as kl

from hydrali.core.errors import HydraliError, first_line
from hydrali.tasks import pretrained as hub

KERAS_WEIGHTS_SUFFIX = ".weights.h5"  # a Keras weights file of the backbone (keras.Model.save_weights)


def _converter(name: str):
    """keras-hub's converter of timm architecture `name` and its backbone's settings; ValueError when it has none."""
    from keras_hub.src.utils.timm.preset_loader import TimmPresetLoader

    config = {"architecture": hub.architecture_of(name)}
    loader = TimmPresetLoader(None, config)
    return loader, loader.converter.convert_backbone_config(config)


def _random_backbone(name: str):
    """keras-hub's backbone for timm architecture `name` with random weights (no file needed: the architecture is
    known from its name, as timm knows it)."""
    from keras_hub.src.utils.timm.preset_loader import TimmPresetLoader

    loader = TimmPresetLoader(None, {"architecture": hub.architecture_of(name)})
    return loader.load_backbone(loader.check_backbone_class(), load_weights=False)


def _unconverted(name: str, err: BaseException) -> str:
    return (
        f"model.name={name} on Keras: {first_line(err)} (keras-hub converts timm's resnet, efficientnet, "
        f"mobilenet, densenet, vgg, csp/dark and hgnetv2 networks; backend=lightning takes any timm model)"
    )


def _backbone(name: str, pretrained: bool, weights: str | None):
    import keras_hub

    if weights is None and not pretrained:
        return _random_backbone(name)
    if weights is None:  # timm's hub, through the cache: the files are fetched (or explained) first
        hub.hub_file(name, hub.CONFIG_FILE)
        hub.hub_file(name, hub.WEIGHTS_FILE)
        return keras_hub.models.Backbone.from_preset(f"hf://{hub.hub_repo(name)}")
    path = Path(weights).expanduser()
    if path.is_file() and path.name.endswith(KERAS_WEIGHTS_SUFFIX):
        backbone = _random_backbone(name)
        backbone.load_weights(path)
        return backbone
    if path.is_file() and (path.parent / hub.CONFIG_FILE).is_file():
        path = path.parent  # timm's weights file in its hub layout: the directory is keras-hub's preset
    if not (path.is_dir() and (path / hub.CONFIG_FILE).is_file() and (path / hub.WEIGHTS_FILE).is_file()):
        raise HydraliError(
            f"model.weights={weights}: on Keras pass a directory holding timm's {hub.CONFIG_FILE} and "
            f"{hub.WEIGHTS_FILE} (what timm.models.save_for_hf writes), or a {KERAS_WEIGHTS_SUFFIX} file of the "
            f"backbone"
        )
    return keras_hub.models.Backbone.from_preset(str(path))


def TimmNetwork(
    num_classes: int, image_size: int | None, name: str, pretrained: bool = False, weights: str | None = None
) -> keras.Model:
    """keras-hub's conversion of timm's network `name` (the same layers and weights as timm's), taking NHWC images of
    image_size x image_size (None: of any side), pooled into a new logits head of `num_classes`."""
    try:
        backbone = _backbone(name, pretrained, weights)
    except ValueError as err:  # keras-hub has no converter for this architecture, or the files do not fit it
        raise HydraliError(_unconverted(name, err)) from err
    inputs = keras.Input((image_size, image_size, 3))
    features = kl.GlobalAveragePooling2D()(backbone(inputs))
    outputs = kl.Dense(num_classes)(features)  # logits, as on torch
    return keras.Model(inputs, outputs, name=f"timm_{hub.architecture_of(name)}")


def check_name(model) -> None:
    """keras-hub converts timm's network model.name (its architecture, the weights' tag aside); else one line."""
    try:
        _converter(str(model.name))
    except ValueError as err:  # keras-hub's converters name an architecture they do not convert
        raise HydraliError(_unconverted(str(model.name), err)) from err


TimmNetwork.check = check_name  # run by core before anything is written (core/config/network_check.py)
