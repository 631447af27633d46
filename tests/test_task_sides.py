"""A task's framework sides as declared interfaces (hydrali.core.contracts.task): TorchSide and KerasSide list every
hook a backend calls, required or optional; the optional ones have their defaults in TorchSideDefaults and
KerasSideDefaults; a built side that lacks a hook is refused in one line naming it, before any work."""

from __future__ import annotations

import types

import pytest

from hydrali.core.contracts.task import (
    KERAS_SIDE,
    TORCH_SIDE,
    KerasSideDefaults,
    TorchSideDefaults,
    checked_side,
)
from hydrali.core.errors import HydraliError
from tests.support.configs import TINY, compose_config

HERE = "tests.test_task_sides"


def _declared(protocol: type) -> set[str]:
    """The members a protocol class declares: its annotated attributes and its methods."""
    methods = {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}
    return set(protocol.__annotations__) | methods


@pytest.mark.parametrize("interface", [TORCH_SIDE, KERAS_SIDE], ids=["torch", "keras"])
def test_every_declared_hook_is_required_or_optional_and_the_defaults_give_the_optional_ones(interface):
    assert set(interface.required).isdisjoint(interface.optional)
    assert set(interface.required) | set(interface.optional) == _declared(interface.protocol)
    assert all(hasattr(interface.defaults, name) for name in interface.optional)
    assert not any(hasattr(interface.defaults, name) for name in interface.required)


def test_the_shipped_sides_derive_from_the_defaults_and_define_every_required_hook():
    from hydrali.tasks.classification.keras_task import KerasClassification
    from hydrali.tasks.classification.torch_task import TorchClassification
    from hydrali.tasks.detection.keras_task import KerasDetection
    from hydrali.tasks.detection.torch_task import TorchDetection

    for side, interface in (
        (TorchClassification, TORCH_SIDE),
        (TorchDetection, TORCH_SIDE),
        (KerasClassification, KERAS_SIDE),
        (KerasDetection, KERAS_SIDE),
    ):
        assert issubclass(side, interface.defaults), side
        own = [name for name in interface.required if name != "model"]  # the network is set when it is built
        assert [name for name in own if not hasattr(side, name)] == [], side


# sides of a task whose `sides` point here (as a user's config would: task.sides.<framework>=module.callable)


class _TorchWithoutValidation(TorchSideDefaults):
    """A torch side without `validation_step` (an nn.Module once torch is imported: see torch_without_validation)."""

    prediction_names = ("logits",)

    def training_loss(self, batch):
        """The loss."""

    def val_metrics_compute(self, epoch):
        """The metrics."""

    def val_metrics_reset(self):
        """Nothing."""

    def predict(self, batch):
        """The batch's images."""
        return {"logits": batch["images"]}


def torch_without_validation(task, model_cfg, dataset, image_size):
    """A task.sides.torch: a side lacking the required `validation_step`."""
    from torch import nn

    class Side(nn.Module, _TorchWithoutValidation):
        def __init__(self):
            super().__init__()
            self.model = nn.Linear(2, 2)

    return Side()


def _anything(self, *args):
    """Nothing."""


def torch_not_deriving_the_defaults(task, model_cfg, dataset, image_size):
    """A task.sides.torch: a side with every required hook but none of the optional ones."""
    from torch import nn

    class Side(nn.Module):
        prediction_names = ("logits",)

        def __init__(self):
            super().__init__()
            self.model = nn.Linear(2, 2)

        training_loss = validation_step = val_metrics_compute = val_metrics_reset = predict = _anything

    return Side()


class _KerasWithoutLoss(KerasSideDefaults):
    prediction_names = ("logits",)

    def build_model(self, model_cfg, num_classes, image_size):
        """No network."""

    def metrics(self):
        """None."""
        return []

    def callbacks(self):
        """None."""
        return []

    def predict(self, network, batch):
        """Nothing."""
        return {}


def keras_without_loss(task, dataset):
    """A task.sides.keras: a side lacking the required `loss` (and `prediction_names`, once removed)."""
    return _KerasWithoutLoss()


def _task(**sides: str):
    return types.SimpleNamespace(name="made_up", sides=sides)


def test_a_torch_side_lacking_a_required_hook_is_refused_when_it_is_built_naming_the_hook():
    from hydrali.backends.torch.side import build_torch_side

    task = _task(torch=f"{HERE}.torch_without_validation")
    with pytest.raises(HydraliError) as refused:
        build_torch_side(task, None, model={}, image_size=8, backend="plain")
    message = str(refused.value)
    assert "lacks the required hook validation_step of hydrali.core.contracts.task.TorchSide" in message
    assert f"task.sides.torch={HERE}.torch_without_validation" in message


def test_a_torch_side_lacking_an_optional_hook_is_told_to_derive_from_the_defaults():
    from hydrali.backends.torch.side import build_torch_side

    task = _task(torch=f"{HERE}.torch_not_deriving_the_defaults")
    with pytest.raises(HydraliError) as refused:
        build_torch_side(task, None, model={}, image_size=8, backend="plain")
    message = str(refused.value)
    assert "lacks the optional hooks serving_names, serving, initialise_from, backbone_parameters" in message
    assert "derive it from hydrali.core.contracts.task.TorchSideDefaults" in message


def test_a_torch_side_that_is_no_module_is_refused():
    from hydrali.backends.torch.side import build_torch_side

    task = _task(torch=f"{HERE}.not_a_module")
    with pytest.raises(HydraliError, match="built a _TorchWithoutValidation, not a torch.nn.Module"):
        build_torch_side(task, None, model={}, image_size=8, backend="plain")


def not_a_module(task, model_cfg, dataset, image_size):
    """A task.sides.torch: a side with every hook that is no nn.Module."""
    side = _TorchWithoutValidation()
    side.model = None
    side.validation_step = lambda batch: None
    return side


def test_a_side_lacking_several_required_hooks_names_each():
    side = _KerasWithoutLoss()
    with pytest.raises(HydraliError) as refused:
        checked_side(types.SimpleNamespace(), KERAS_SIDE, _task(keras="m.f"), "keras")
    assert "required hooks prediction_names, build_model, loss, metrics, callbacks, predict" in str(refused.value)
    with pytest.raises(HydraliError, match="lacks the required hook loss of hydrali.core.contracts.task.KerasSide"):
        checked_side(side, KERAS_SIDE, _task(keras="m.f"), "keras")


@pytest.mark.keras
def test_a_keras_side_lacking_a_required_hook_is_refused_when_it_is_built_naming_the_hook():
    from hydrali.backends.keras.side import build_keras_side

    with pytest.raises(HydraliError) as refused:
        build_keras_side(_task(keras=f"{HERE}.keras_without_loss"), None)
    message = str(refused.value)
    assert f"task.sides.keras={HERE}.keras_without_loss: its side (_KerasWithoutLoss)" in message
    assert "lacks the required hook loss of hydrali.core.contracts.task.KerasSide" in message


def test_the_torch_defaults_serve_the_predictions_and_refuse_what_the_side_cannot_do():
    class Side(TorchSideDefaults):
        prediction_names = ("logits", "extra")

        def predict(self, batch):
            return {"logits": batch["images"] * 2, "extra": 0}

    side = Side()
    assert side.serving_names == ("logits", "extra")
    assert side.serving({"images": 3}) == {"logits": 6, "extra": 0}
    with pytest.raises(HydraliError, match=r"torch side \(Side\) has no `initialise_from`: it cannot start from"):
        side.initialise_from({})
    with pytest.raises(HydraliError, match=r"has no `backbone_parameters`: it cannot tell its backbone"):
        side.backbone_parameters()


def test_the_keras_defaults_serve_the_predictions_validate_the_network_and_refuse_what_the_side_cannot_do():
    class Side(KerasSideDefaults):
        prediction_names = ("logits",)

        def predict(self, network, batch):
            return {"logits": network(batch["images"], training=False)}

    def network(images, training):
        return ("network", images, training)

    side = Side()
    assert side.serving_names == ("logits",)
    assert side.serving(network, {"images": 1}) == {"logits": ("network", 1, False)}
    assert side.evaluation_forward(network, 1) == ("network", 1, False)
    assert side.on_val_batch({}, None, None) is None
    with pytest.raises(HydraliError, match=r"Keras side \(Side\) has no `initialise_from`"):
        side.initialise_from(network, network)
    with pytest.raises(HydraliError, match=r"Keras side \(Side\) has no `backbone_variables`"):
        side.backbone_variables(network)


@pytest.mark.keras
def test_the_classification_task_builds_sides_that_pass_the_check(tmp_path, data_dir):
    """What the backends build from the default config: both sides are accepted, with their own hooks where they have
    them and the defaults elsewhere."""
    from hydra.utils import instantiate

    from hydrali.backends.keras.side import build_keras_side
    from hydrali.backends.torch.side import build_torch_side

    cfg = compose_config(list(TINY), tmp_path, data_dir)
    task = instantiate(cfg.task)
    dataset = task.prepare_data(cfg.data, verify="off")
    torch_side = build_torch_side(task, dataset, model=cfg.model, image_size=16, backend="lightning")
    keras_side = build_keras_side(task, dataset)
    assert torch_side.serving_names == ("logits",) and keras_side.serving_names == ("logits",)
    assert type(keras_side).on_val_batch is not KerasSideDefaults.on_val_batch  # val/acc in NumPy
    assert type(keras_side).evaluation_forward is not KerasSideDefaults.evaluation_forward  # flip averaging
    assert type(torch_side).initialise_from is not TorchSideDefaults.initialise_from
