"""Generic rules by which a config derives one setting from another value (each registered as a resolver in
hydrali.core.config.store), so that a YAML file states the dependency and core knows no task: e.g.
conf/task/classification.yaml's flip_averaging, `${hydrali_positive:${oc.select:pipeline.options.flip_probability,0}}`
(on exactly when training mirrors the images). The image-size rule is hydrali.core.config.image_size.by_size."""

from __future__ import annotations


def positive(value: float | int | None) -> bool:
    """Whether `value` (a number from the config; None counts as 0) is above zero."""
    return value is not None and float(value) > 0
