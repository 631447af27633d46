"""Each closed set of values is declared once, as an enum of the schema (hydrali.core.config.schema): the code that
acts on a value keys its table by that enum and covers exactly its members, takes each of them as the runner passes
it (a string), and refuses any other value, as code called without the schema may receive, naming the choices."""

import pytest

from hydrali.core.config.schema import Device, LastBatch, Optimizer, Precision, Scale, Schedule
from hydrali.core.data.devices import resolve_device
from hydrali.core.errors import HydraliError
from hydrali.core.optim.schedule import AFTER_WARMUP, lr_factor
from hydrali.core.run.epoch import TRAIN_STEPS, make_epoch_steps
from hydrali.core.run.plan import SCALE_RULES, scaled_lr


def _scale(value):
    return scaled_lr(0.1, global_batch=512, ref_batch=256, rule=value)


def _schedule(value):  # step 18 of 20, 13 of the 15 after warmup: flat_cosine has left its flat three quarters
    return lr_factor(18, steps_per_epoch=10, epochs=2, warmup_epochs=0.5, warmup_div=10.0, schedule=value)


def _last_batch(value):
    return make_epoch_steps(train_samples=100, val_samples=10, num_shards=2, batch=8, last_batch=value).train_steps


TAKERS = {  # setting -> (its schema enum, the code's table keyed by it, a call taking the value as a string)
    "optim.scale": (Scale, SCALE_RULES, _scale),
    "optim.schedule": (Schedule, AFTER_WARMUP, _schedule),
    "pipeline.train_last_batch": (LastBatch, TRAIN_STEPS, _last_batch),
}


@pytest.mark.parametrize("setting", TAKERS)
def test_the_codes_table_covers_exactly_the_schemas_choices(setting):
    choice, table, _ = TAKERS[setting]
    assert set(table) == set(choice), f"{setting}: the schema's {choice.__name__} and the code's table differ"


@pytest.mark.parametrize("setting", TAKERS)
def test_every_value_the_schema_allows_is_taken_and_any_other_is_refused_naming_the_choices(setting):
    choice, _, take = TAKERS[setting]
    results = {value: take(value) for value in choice.values()}
    assert len(set(results.values())) == len(results), f"{setting}: each value acts differently here: {results}"
    with pytest.raises(HydraliError) as refused:
        take("bogus")
    assert str(refused.value) == f"{setting}='bogus': choose one of {', '.join(choice.values())}"


def test_every_device_the_schema_allows_resolves_and_any_other_is_refused_naming_the_choices():
    for value in Device.values():
        try:
            assert resolve_device(value) in ("cpu", "gpu")
        except HydraliError as err:  # gpu on a machine where DALI sees no GPU: refused for that reason only
            assert value == "gpu" and "choose one of" not in str(err), err
    with pytest.raises(HydraliError) as refused:
        resolve_device("tpu")
    assert str(refused.value) == f"pipeline.device='tpu': choose one of {', '.join(Device.values())}"


@pytest.mark.keras
def test_every_precision_the_schema_allows_has_a_keras_dtype_policy():
    from hydrali.backends.keras.precision import POLICIES

    assert set(POLICIES) == set(Precision.values())


def test_every_optimizer_the_schema_allows_is_built_on_torch():
    from hydrali.backends.torch.optim import OPTIMIZERS

    assert set(OPTIMIZERS) == set(Optimizer)


@pytest.mark.keras
def test_every_optimizer_the_schema_allows_is_built_on_keras():
    from hydrali.backends.keras.optimizers import OPTIMIZERS

    assert set(OPTIMIZERS) == set(Optimizer)
