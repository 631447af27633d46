"""The classification task on Keras: model, loss and metrics, used by the Keras backend."""
from __future__ import annotations

import keras
from hydra.utils import instantiate
from omegaconf import DictConfig, open_dict


def build_model(model_cfg: DictConfig, num_classes: int, image_size: int) -> keras.Model:
    """The network described by `model_cfg`, built through its `keras_target` (any callable returning a keras.Model)."""
    spec = model_cfg.copy()
    if "keras_target" not in spec:
        raise ValueError(f"model={spec.get('_target_')} has no keras_target: it cannot be built on Keras")
    with open_dict(spec):
        spec._target_ = spec.pop("keras_target")
    model = instantiate(spec, num_classes=num_classes, image_size=image_size)
    if not isinstance(model, keras.Model):
        raise TypeError(f"model.keras_target={spec._target_} returned {type(model).__name__}, not a keras.Model")
    return model


def loss(task) -> keras.losses.Loss:
    """Cross-entropy on logits with integer labels."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def metrics(task) -> list:
    """Top-1 accuracy, logged as `acc` (val/acc once mapped)."""
    return [keras.metrics.SparseCategoricalAccuracy(name="acc")]


def labels_shape() -> tuple:
    """The per-sample shape of the labels the recipe returns."""
    return (1,)
