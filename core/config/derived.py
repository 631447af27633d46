"""Generic rules by which a config derives one setting from another value (each registered as a resolver in
hydrali.core.config.store), so that a YAML file states the dependency and core knows no task: e.g.
conf/task/classification.yaml's flip_averaging, `${hydrali_positive:${oc.select:pipeline.options.flip_probability,0}}`
(on exactly when training mirrors the images). The image-size rule is hydrali.core.config.image_size.by_size."""

from __future__ import annotations

from typing import Any


def positive(value: Any) -> bool:
    """Whether `value` (a number from the config) is above zero; False for None or a value that is no number, which
    the option's own check names (e.g. a recipe's option of the wrong kind: one line, exit 2)."""
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False
