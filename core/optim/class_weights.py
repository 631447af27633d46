"""The loss's weight of each class (task.class_weights), decided once for both backends: `auto` weighs class k by
N / (K * n_k) (N training images, K classes, n_k of class k: the inverse frequency, scikit-learn's "balanced"), so
that every class weighs the same in an epoch and the mean weight over the training images is 1; a list gives them
as they are. How a backend applies them: hydrali.core.optim.optimizer (each sample's loss times its class's weight,
averaged over the batch's samples).

`auto` is bounded: no class weighs more than MAX_RATIO times the most frequent class. Unbounded, 20,000 images of one
class and 1 of another give weights 0.5 and 10,000: the one image's gradient swamps every batch it is in and the
network collapses onto it (seen: val/acc 0.02, val/loss 5,927). A cap keeps the weights' spread, and so the
gradients' scale, within one order of magnitude whatever the counts (the classes that reach it are named in a
warning), and is the balanced weighting itself whenever the counts differ less than MAX_RATIO-fold; the weights are
then scaled so that their mean over the training images stays 1 (the learning rate means what it meant)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from omegaconf import ListConfig

from hydrali.core.errors import HydraliError

log = logging.getLogger("hydrali")

AUTO = "auto"  # task.class_weights=auto: the inverse frequency of each class in the training split
MAX_RATIO = 10.0  # auto: the largest weight is at most this many times the smallest (see above)
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
        return bounded_balanced(train_counts, classes)
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


def bounded_balanced(train_counts: Sequence[int], classes: Sequence[str]) -> tuple[float, ...]:
    """The inverse-frequency weights of `train_counts`, none above MAX_RATIO times the smallest, scaled to a mean
    of 1 over the training images; a warning names the classes whose weight was capped."""
    total = sum(train_counts)
    balanced = [total / (len(classes) * count) for count in train_counts]
    cap = min(balanced) * MAX_RATIO
    weights = [min(weight, cap) for weight in balanced]
    capped = [(name, count) for name, count, weight in zip(classes, train_counts, balanced) if weight > cap]
    if capped:
        most = max(train_counts)
        named = ", ".join(f"{name} ({count} image{'s' * (count != 1)})" for name, count in capped[:SHOWN_CLASSES])
        more = f" and {len(capped) - SHOWN_CLASSES} more" if len(capped) > SHOWN_CLASSES else ""
        log.warning(
            "task.class_weights=auto: the training split is extremely imbalanced (%d images in its largest class): "
            "the weights of %s%s are capped at %gx the largest class's; more images of them would help",
            most,
            named,
            more,
            MAX_RATIO,
        )
    scale = total / sum(count * weight for count, weight in zip(train_counts, weights))
    return tuple(weight * scale for weight in weights)


def describe(weights: Sequence[float], classes: Sequence[str], shown: int = SHOWN_CLASSES) -> str:
    """The weights in words for the run log (`name weight, ...`, the first `shown` classes)."""
    words = ", ".join(f"{name} {weight:.3g}" for name, weight in zip(classes[:shown], weights[:shown]))
    return words + (f", ... ({len(classes)} classes)" if len(classes) > shown else "")
