"""Fine-tuning a torch network (conf/model_common.yaml): which of its parts train."""

from __future__ import annotations

from torch import nn

from hydrali.core.errors import HydraliError


def backbone(model: nn.Module) -> list[nn.Module]:
    """The backbone of `model`: its child modules holding parameters but its head (timm's classifier, else the last
    such child); a one-line error when there is none, or when the network holds parameters outside its children
    (e.g. a ViT's class token), which neither freezing nor a backbone lr could reach."""
    holding = [child for child in model.children() if any(True for _ in child.parameters())]
    if hasattr(model, "get_classifier"):  # timm: its classifier, or (head, head_dist) of distilled models
        head = model.get_classifier()
        head = list(head) if isinstance(head, (tuple, list)) else [head]
    else:
        head = holding[-1:]
    found = [child for child in holding if all(child is not h for h in head)]
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
