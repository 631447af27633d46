"""Fine-tuning a Keras network (conf/model_common.yaml): which of its layers train."""

from __future__ import annotations

import keras


def backbone(model: keras.Model) -> list:
    """The backbone of `model`: its layers before its head, the last layer holding weights."""
    return [layer for layer in model.layers if layer.weights][:-1]


def freeze(model: keras.Model, what: str | None) -> None:
    """Stop `what` of `model` from training (None: nothing; "backbone": every layer before its head, the last layer
    holding weights). A BatchNormalization layer that does not train runs in inference mode: its statistics stay."""
    if what is None:
        return
    for layer in backbone(model):
        layer.trainable = False
