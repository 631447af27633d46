"""The task's Keras side as the Keras backend builds it, and its network started from, or loaded from, a hydrali
Keras checkpoint (model.weights; a trained run's network for inference)."""

from __future__ import annotations

import contextlib
from typing import Any

import keras

from hydrali.backends.keras.model import TaskModel
from hydrali.backends.keras.spec import SPEC
from hydrali.core.contracts.task import KERAS_SIDE, checked_side, side_builder
from hydrali.core.errors import HydraliError, first_line
from hydrali.core.run.weights_from_run import RunWeights


def build_keras_side(task, dataset):
    """The task's Keras side (network builder, loss, metrics, callbacks) for `dataset`; a HydraliError names the
    side that cannot be imported or built, or the hooks of hydrali.core.contracts.task.KerasSide it lacks."""
    build = side_builder(task, SPEC.framework, SPEC.name)
    try:
        side = build(task, dataset)
    except Exception as err:
        raise HydraliError(f"task.sides.{SPEC.framework}={task.sides[SPEC.framework]} cannot be built: {err}") from err
    return checked_side(side, KERAS_SIDE, task, SPEC.framework)


def start_network_from(network: keras.Model, side, start: RunWeights, weights: str, image_size: int) -> None:
    """Start `network` (built by the task's Keras `side`) from the checkpoint of an earlier run (model.weights,
    found by hydrali.core.run.weights_from_run): that run's network is built as it was and loaded from its
    checkpoint, then the side copies its weights, with a new head when the classes differ."""
    try:
        trained = load_network(side, start.model(), start.num_classes, image_size, start.checkpoint)
        head = side.initialise_from(network, trained)
    except HydraliError as err:
        raise HydraliError(f"model.weights={weights}: {start.checkpoint}: {err}") from err
    except Exception as err:
        raise HydraliError(f"model.weights={weights}: {start.checkpoint} cannot be read ({first_line(err)})") from err
    start.announce(head)


def load_network(side, model: Any, num_classes: int, image_size: int, checkpoint) -> keras.Model:
    """The network that the task's Keras `side` builds from the `model` node (untrained: as_built), with the weights
    of a hydrali Keras checkpoint (which holds it wrapped in a TaskModel, and the optimizer's state: skipped)."""
    network = side.build_model(model, num_classes, image_size)
    holder = TaskModel(network, [1], batch=1)
    holder(keras.ops.zeros((1, *network.input_shape[1:])))
    with _quiet_keras_loading():
        holder.load_weights(checkpoint)
    return network


@contextlib.contextmanager
def _quiet_keras_loading():
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*[Ss]kipping variable loading.*")
        yield
