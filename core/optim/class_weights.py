"""The loss's weight of each class (task.class_weights), decided once for both backends: `auto` weighs class k by
N / (K * n_k) (N training images, K classes, n_k of class k: the inverse frequency, scikit-learn's "balanced"), so
that every class weighs the same in an epoch and the mean weight over the training images is 1; a list gives them
as they are. How a backend applies them: hydrali.core.optim.optimizer (each sample's loss times its class's weight,
averaged over the batch's samples)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from omegaconf import ListConfig

from hydrali.core.errors import HydraliError

AUTO = "auto"  # task.class_weights=auto: the inverse frequency of each class in the training split
SHOWN_CLASSES = 5  # how many classes a message or the log names


def resolve_class_weights(setting, train_counts: Sequence[int], classes: Sequence[str]) -> tuple[float, ...] | None:
    """The weight of each class (in the order of `classes`) that `setting` (task.class_weights: null, auto or a list
    of one positive number per class) gives a training split of `train_counts` images per class; None: every class
    weighs 1. A one-line error names a setting that does not fit the classes."""
    if setting is None:
        return None
    if isinstance(setting, str):
        if setting != AUTO:
            raise HydraliError(f"task.class_weights={setting}: pass null, auto, or a list of {len(classes)} weights")
        if 0 in train_counts:
            empty = classes[list(train_counts).index(0)]
            raise HydraliError(f"task.class_weights=auto: class {empty} has no training image left to weigh")
        total = sum(train_counts)
        return tuple(total / (len(classes) * count) for count in train_counts)
    if not isinstance(setting, (list, tuple, ListConfig)):
        raise HydraliError(f"task.class_weights={setting}: pass null, auto, or a list of {len(classes)} weights")
    weights = list(setting)
    if len(weights) != len(classes):
        raise HydraliError(
            f"task.class_weights has {len(weights)} weights for {len(classes)} classes "
            f"({', '.join(classes[:SHOWN_CLASSES])}{', ...' if len(classes) > SHOWN_CLASSES else ''}): give one per "
            f"class, in that order, or auto"
        )
    try:
        weights = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise HydraliError(f"task.class_weights={setting}: pass numbers, one per class") from None
    if not all(w > 0 and math.isfinite(w) for w in weights):
        raise HydraliError(f"task.class_weights={setting}: every weight must be a positive finite number")
    return tuple(weights)


def describe(weights: Sequence[float], classes: Sequence[str], shown: int = SHOWN_CLASSES) -> str:
    """The weights in words for the run log (`name weight, ...`, the first `shown` classes)."""
    words = ", ".join(f"{name} {weight:.3g}" for name, weight in zip(classes[:shown], weights[:shown]))
    return words + (f", ... ({len(classes)} classes)" if len(classes) > shown else "")
