"""Fine-tuning a torch network (conf/model_common.yaml): which of its parts train."""

from __future__ import annotations

from torch import nn

from hydrali.core.errors import HydraliError


def backbone(model: nn.Module) -> list[nn.Module]:
    """The backbone of `model`: its child modules before its head, the last child holding parameters; a one-line
    error when it has none (a network of one child cannot be told apart)."""
    found = [child for child in model.children() if any(True for _ in child.parameters())][:-1]
    if not found:
        raise HydraliError(
            f"model.freeze / optim.backbone_lr_mult: {type(model).__name__} has no backbone apart from its head "
            f"(hydrali takes its last child module holding parameters as the head, the ones before as the backbone)"
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
