"""model=timm on torch: any network of timm's registry, from random weights, its pretrained weights (the Hugging Face
cache or hub) or a local copy of them (conf/model/timm.yaml). timm is imported only when such a model is built."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from hydrali.core.errors import HydraliError, first_line
from hydrali.tasks import pretrained as hub


def weights_file(weights: str) -> Path:
    """The weights file that model.weights names: the file itself, or a directory's model.safetensors (timm's hub
    layout); a one-line error when there is none."""
    path = Path(weights).expanduser()
    if path.is_dir():
        path = path / hub.WEIGHTS_FILE
    if not path.is_file():
        raise HydraliError(
            f"model.weights={weights}: no such file; pass a timm weights file (.safetensors, .pth) or a directory "
            f"holding {hub.WEIGHTS_FILE} and {hub.CONFIG_FILE} (what timm.models.save_for_hf writes)"
        )
    return path


def TimmNetwork(num_classes: int, name: str, pretrained: bool = False, weights: str | None = None) -> nn.Module:
    """timm's network `name` with a new classification head of `num_classes` (its weights random): from random
    weights, from the pretrained weights of timm's hub (`pretrained`), or from a local weights file or directory
    (`weights`)."""
    import timm

    overlay = None
    if weights is not None:
        overlay = {"file": str(weights_file(weights))}
    elif pretrained:
        hub.hub_file(name, hub.WEIGHTS_FILE)  # a one-line error, naming where to put it, when it cannot be had
    try:
        # without a classifier, so that timm leaves out the weights' own (of any number of classes)
        network = timm.create_model(
            name, pretrained=bool(pretrained or overlay), pretrained_cfg_overlay=overlay, num_classes=0
        )
    except RuntimeError as err:  # an unknown name, or weights of another architecture
        raise HydraliError(f"model.name={name}: {first_line(err)}") from err
    network.reset_classifier(num_classes)  # the head is the dataset's, whatever the weights held
    return network
