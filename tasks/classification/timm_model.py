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


def _load_weights(network: nn.Module, weights: str) -> None:
    """Load the weights file that model.weights names into `network` (timm's, without its classifier): every tensor
    of the network must be in the file, and the file may hold no other but a classifier's; else one line."""
    from timm.models import load_state_dict

    path = weights_file(weights)
    try:
        state = load_state_dict(str(path))
    except Exception as err:  # not a state_dict timm reads (a pickled checkpoint of another kind, a damaged file)
        raise HydraliError(
            f"model.weights={weights}: {path} cannot be read as timm's weights ({first_line(err)})"
        ) from err
    head = network.pretrained_cfg.get("classifier") or ()
    head = (head,) if isinstance(head, str) else tuple(head)
    state = {key: value for key, value in state.items() if not key.startswith(tuple(f"{h}." for h in head))}
    try:
        missing, unexpected = network.load_state_dict(state, strict=False)
    except RuntimeError as err:  # tensors of other shapes: another architecture
        raise HydraliError(
            f"model.weights={weights}: its tensors do not fit model.name={network.pretrained_cfg.get('architecture')} "
            f"({first_line(err).rstrip(':')}: {str(err).splitlines()[-1].strip()})"
        ) from err
    if missing or unexpected:
        raise HydraliError(
            f"model.weights={weights}: not weights of model.name={network.pretrained_cfg.get('architecture')}: "
            f"{len(missing)} of its tensors missing (first: {(missing or ['none'])[0]}), {len(unexpected)} unknown "
            f"(first: {(unexpected or ['none'])[0]})"
        )


def TimmNetwork(num_classes: int, name: str, pretrained: bool = False, weights: str | None = None) -> nn.Module:
    """timm's network `name` with a new classification head of `num_classes` (its weights random): from random
    weights, from the pretrained weights of timm's hub (`pretrained`), or from a local weights file or directory
    (`weights`)."""
    import timm

    if pretrained and weights is None:
        hub.hub_file(name, hub.WEIGHTS_FILE)  # a one-line error, naming where to put it, when it cannot be had
    try:
        # without a classifier, so that timm leaves out the weights' own (of any number of classes)
        network = timm.create_model(name, pretrained=bool(pretrained and weights is None), num_classes=0)
    except RuntimeError as err:  # an unknown name
        raise HydraliError(f"model.name={name}: {first_line(err)}") from err
    if weights is not None:
        _load_weights(network, weights)
    network.reset_classifier(num_classes)  # the head is the dataset's, whatever the weights held
    return network


def check_name(model) -> None:
    """model.name is a network of timm's registry (its architecture, the weights' tag aside); else one line naming
    the closest names."""
    import difflib

    import timm

    architecture = hub.architecture_of(str(model.name))
    if timm.is_model(architecture):
        return
    close = difflib.get_close_matches(architecture, timm.list_models(), n=3)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise HydraliError(
        f"model.name={model.name} is not a network of timm's registry: {hint}"
        f"(timm.list_models('{architecture[:3]}*') lists those of that start)"
    )


TimmNetwork.check = check_name  # run by core before anything is written (core/config/network_check.py)
