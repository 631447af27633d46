"""Fine-tuning a torch network (conf/model_common.yaml): which of its parts train, and starting it from the weights
of an earlier run (a new head when the classes differ)."""

from __future__ import annotations

from torch import nn

from hydrali.core.errors import HydraliError


def _holding(model: nn.Module) -> list[nn.Module]:
    """The child modules of `model` that hold parameters."""
    return [child for child in model.children() if any(True for _ in child.parameters())]


def heads(model: nn.Module) -> list[nn.Module]:
    """The head of `model`: timm's classifier (or (head, head_dist) of distilled models), else its last child module
    holding parameters."""
    if hasattr(model, "get_classifier"):
        head = model.get_classifier()
        return list(head) if isinstance(head, (tuple, list)) else [head]
    return _holding(model)[-1:]


def backbone(model: nn.Module) -> list[nn.Module]:
    """The backbone of `model`: its child modules holding parameters but its head; a one-line error when there is
    none, or when the network holds parameters outside its children (e.g. a ViT's class token), which neither
    freezing nor a backbone lr could reach."""
    head = heads(model)
    found = [child for child in _holding(model) if all(child is not h for h in head)]
    if not found:
        raise HydraliError(
            f"model.freeze / optim.backbone_lr_mult: {type(model).__name__} has no backbone apart from its head "
            f"(hydrali takes its last child module holding parameters as the head, the ones before as the backbone)"
        )
    own = [name for name, _ in model.named_parameters(recurse=False)]
    if own:
        raise HydraliError(
            f"model.freeze / optim.backbone_lr_mult: {type(model).__name__} holds parameters of its own outside its "
            f"modules ({', '.join(own)}): not supported yet"
        )
    return found


def freeze(model: nn.Module, what: str | None) -> list[nn.Module]:
    """Stop `what` of `model` from training (None: nothing; "backbone": every child module before its head, the last
    child holding parameters); return the frozen modules, which the caller keeps in eval mode so that their
    BatchNorm statistics stay as they are."""
    if what is None:
        return []
    frozen = backbone(model)
    for module in frozen:
        module.requires_grad_(False)
        module.eval()
    return frozen


def start_from(model: nn.Module, state: dict) -> bool:
    """Load `state` (another run's state_dict of the same network) into `model`, but its head where the shapes
    differ (another number of classes: the head stays new); return whether the head was loaded too. A HydraliError
    says which tensors do not fit when the network is another one."""
    own = model.state_dict()
    unfit = sorted(key for key in own.keys() & state.keys() if own[key].shape != state[key].shape)
    head_modules = heads(model)
    head = tuple(f"{name}." for name, module in model.named_modules() if any(module is h for h in head_modules))
    wrong = sorted(own.keys() ^ state.keys()) + [key for key in unfit if not key.startswith(head)]
    if wrong:
        key = wrong[0]
        shapes = f"{tuple(state[key].shape) if key in state else 'absent'} there, "
        shapes += f"{tuple(own[key].shape) if key in own else 'absent'} here"
        raise HydraliError(f"its weights do not fit this network: {len(wrong)} tensors differ, e.g. {key} ({shapes})")
    model.load_state_dict({key: value for key, value in state.items() if key not in unfit}, strict=False)
    return not unfit
