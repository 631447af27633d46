"""Fine-tuning a torch network (conf/model_common.yaml): which of its parts train."""

from __future__ import annotations

from torch import nn


def freeze(model: nn.Module, what: str | None) -> list[nn.Module]:
    """Stop `what` of `model` from training (None: nothing; "backbone": every child module before its head, the last
    child holding parameters); return the frozen modules, which the caller keeps in eval mode so that their
    BatchNorm statistics stay as they are."""
    if what is None:
        return []
    children = [child for child in model.children() if any(True for _ in child.parameters())]
    frozen = children[:-1]
    for module in frozen:
        module.requires_grad_(False)
        module.eval()
    return frozen
