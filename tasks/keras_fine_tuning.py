"""Fine-tuning a Keras network (conf/model_common.yaml): which of its layers train, and starting it from the weights
of an earlier run (a new head when the classes differ)."""

from __future__ import annotations

import keras

from hydrali.core.errors import HydraliError


def _holding(model: keras.Model) -> list:
    """The layers of `model` that hold weights."""
    return [layer for layer in model.layers if layer.weights]


def backbone(model: keras.Model) -> list:
    """The backbone of `model`: its layers before its head, the last layer holding weights."""
    return _holding(model)[:-1]


def freeze(model: keras.Model, what: str | None) -> None:
    """Stop `what` of `model` from training (None: nothing; "backbone": every layer before its head, the last layer
    holding weights). A BatchNormalization layer that does not train runs in inference mode: its statistics stay."""
    if what is None:
        return
    for layer in backbone(model):
        layer.trainable = False


def start_from(model: keras.Model, trained: keras.Model) -> bool:
    """Copy the weights of `trained` (another run's network, built from the same config) into `model`, but its head
    where the shapes differ (another number of classes: the head stays new); return whether the head was copied too.
    A HydraliError says which layer does not fit when the network is another one."""
    own, then = _holding(model), _holding(trained)
    if len(own) != len(then):
        raise HydraliError(
            f"its weights do not fit this network: {len(then)} layers with weights there, {len(own)} here"
        )
    head_copied = True
    for index, (layer, source) in enumerate(zip(own, then)):
        shapes_here = [tuple(w.shape) for w in layer.weights]
        shapes_there = [tuple(w.shape) for w in source.weights]
        if shapes_here != shapes_there:
            if index == len(own) - 1:  # the head, for another number of classes
                head_copied = False
                continue
            raise HydraliError(
                f"its weights do not fit this network: layer {layer.name} is {shapes_there} there, {shapes_here} here"
            )
        layer.set_weights(source.get_weights())
    return head_copied
