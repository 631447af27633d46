"""optim.ema_decay: the average of the weights (hydrali.core.optim.ema) that each backend keeps equals the formula
over the weights after each optimizer step, gradient accumulation included; validation scores it, the checkpoints
hold it as the network's weights, a resume continues it from the live weights; and a decay out of (0, 1) is one
line."""

from pathlib import Path

import numpy as np
import pytest

from hydrali.core.optim.ema import weight_average
from tests.support.checks import fails_with
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY
from tests.support.datasets import write_one_image_per_class
from tests.support.settings import optim_settings
from tests.support.weight_snapshots import read_snapshots

DECAY = 0.9
CLASSES, BATCH, ACCUMULATE, EPOCHS = 24, 4, 2, 2  # 6 batches, 3 optimizer steps an epoch
STEPS_PER_EPOCH = CLASSES // BATCH // ACCUMULATE
TOLERANCE = 1e-6
QUIET = {"lightning": LIGHTNING_QUIET, "keras": KERAS_QUIET}
# SGD at a large constant lr, so that the weights move well beyond the tolerance at every step
FAST_STEPS = ["optim.lr=0.5", "optim.scale=none", "optim.warmup_epochs=0", "optim.schedule=constant"]


def _assert_close(actual, expected, what: str) -> None:
    assert len(actual) == len(expected), what
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(np.asarray(a, dtype=np.float64), e, atol=TOLERANCE, rtol=0, err_msg=what)


def _assert_differ(a, b, what: str) -> None:
    assert any(
        np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max() > 100 * TOLERANCE for x, y in zip(a, b)
    ), what


def _train(make_cfg, tmp_path: Path, backend: str, snapshots: str, *extra: str) -> dict:
    """A run of `backend` in tmp_path/<backend> on one image per class with the average on, its weights recorded by
    tests.support.weight_snapshots.<snapshots>: what it recorded."""
    from hydrali.core.run.runner import run

    if not (tmp_path / "ds").is_dir():
        write_one_image_per_class(tmp_path / "ds", CLASSES)
    record = tmp_path / f"snapshots{len(list(tmp_path.glob('snapshots*')))}.pkl"
    run(
        make_cfg(
            f"backend={backend}",
            "data=imagefolder",
            f"data.root={tmp_path / 'ds'}",
            f"data.batch_size={BATCH}",
            f"epochs={EPOCHS}",
            f"optim.accumulate_grad_batches={ACCUMULATE}",
            f"optim.ema_decay={DECAY}",
            "tracking=none",
            *FAST_STEPS,
            *TINY,
            *QUIET[backend],
            f"+backend.callbacks.snapshots={{_target_: tests.support.weight_snapshots.{snapshots}, path: '{record}'}}",
            *extra,
            output_dir=tmp_path / backend,
        )
    )
    return read_snapshots(record)


def _train_interrupted_and_resumed(make_cfg, tmp_path: Path, backend: str, snapshots: str, interrupt: str):
    """The run of `_train` interrupted (Ctrl+C, by the callback `interrupt`) when its second epoch starts, then
    resumed (ckpt_path=last): what the first part recorded, what the resumed part recorded."""
    stop = f"+backend.callbacks.interrupt={{_target_: {interrupt}, epoch: 1}}"
    with pytest.raises(KeyboardInterrupt):
        _train(make_cfg, tmp_path, backend, snapshots, stop)
    first = read_snapshots(tmp_path / "snapshots0.pkl")
    return first, _train(make_cfg, tmp_path, backend, snapshots, "ckpt_path=last")


def _check_validation_and_resume(first: dict, resumed: dict) -> list[np.ndarray]:
    """Each part trained an epoch of optimizer steps and validated the average of the steps so far (not the live
    weights); the resumed part started from the first part's live weights. The average after the last step."""
    steps = first["steps"] + resumed["steps"]
    assert len(first["steps"]) == len(resumed["steps"]) == STEPS_PER_EPOCH
    assert len(first["scored"]) == len(resumed["scored"]) == 1
    for scored, so_far in ((first["scored"][0], first["steps"]), (resumed["scored"][0], steps)):
        _assert_close(scored, weight_average(so_far, DECAY), f"validation after {len(so_far)} steps")
        _assert_differ(scored, so_far[-1], "the average is not the live weights")
    _assert_close(resumed["start"], first["steps"][-1], "a resume trains on from the live weights")
    return weight_average(steps, DECAY)


def test_lightning_validates_checkpoints_and_resumes_the_average_of_its_optimizer_steps(make_cfg, tmp_path):
    import torch

    from hydrali.backends.torch.ema import LIVE_WEIGHTS_KEY

    first, resumed = _train_interrupted_and_resumed(
        make_cfg, tmp_path, "lightning", "LightningWeightSnapshots", "tests.support.plugins.InterruptAtEpoch"
    )
    average = _check_validation_and_resume(first, resumed)
    checkpoint = torch.load(tmp_path / "lightning" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    live = checkpoint[LIVE_WEIGHTS_KEY]
    assert live["steps"] == EPOCHS * STEPS_PER_EPOCH
    names = list(live["weights"])  # the trainable parameters, in the module's order
    _assert_close([checkpoint["state_dict"][name] for name in names], average, "last.ckpt's weights")
    _assert_close(list(live["weights"].values()), resumed["steps"][-1], "last.ckpt's live weights")


@pytest.mark.keras
def test_keras_validates_checkpoints_resumes_and_ends_with_the_average_of_its_optimizer_steps(make_cfg, tmp_path):
    import h5py

    first, resumed = _train_interrupted_and_resumed(
        make_cfg, tmp_path, "keras", "KerasWeightSnapshots", "tests.support.plugins.KerasInterruptAtEpoch"
    )
    average = _check_validation_and_resume(first, resumed)
    _assert_close(resumed["final"], average, "the weights after fit")
    with h5py.File(tmp_path / "keras" / "checkpoints" / f"epoch{EPOCHS:03d}.weights.h5", "r") as saved:
        network = _h5_arrays(saved, "layers")  # the model's weights, not its optimizer's
        optimizer = _h5_arrays(saved, "optimizer")
    for expected in average:  # each averaged weight is one of the network's in the checkpoint
        assert any(a.shape == expected.shape and np.allclose(a, expected, atol=TOLERANCE, rtol=0) for a in network)
    for live in resumed["steps"][-1]:  # the last step's live weights stay in its optimizer state (a later resume's)
        assert any(a.shape == live.shape and np.allclose(a, live, atol=TOLERANCE, rtol=0) for a in optimizer)


def _h5_arrays(group, under: str) -> list[np.ndarray]:
    arrays = []
    group[under].visititems(lambda _, item: arrays.append(item[()]) if hasattr(item, "shape") else None)
    return arrays


FEATURES, HIDDEN, OUTPUTS, SAMPLES, STEPS = 12, 16, 5, 8, 4


def _step_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * ACCUMULATE, SAMPLES, FEATURES)).astype("float32")
    y = rng.integers(0, OUTPUTS, size=(STEPS * ACCUMULATE, SAMPLES, 1)).astype("int32")
    shapes = [(FEATURES, HIDDEN), (HIDDEN,), (HIDDEN, OUTPUTS), (OUTPUTS,)]
    weights = [(rng.normal(size=shape) * 0.3).astype("float32") for shape in shapes]
    return x, y, weights


OPTIM = optim_settings(name="sgd", weight_decay=1e-2, momentum=0.9, nesterov=True, betas=[0.9, 0.999], ema_decay=DECAY)


def _torch_average(x, y, weights):
    """The torch backends' average (WeightAverage after each optimizer step of accumulated batches): (the weights
    after each step, the average after the last), as Keras lays them out."""
    import torch

    from hydrali.backends.torch.ema import WeightAverage
    from hydrali.backends.torch.optim import make_optimizer
    from hydrali.tasks.classification.torch_task import TorchClassification

    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUTPUTS))
    with torch.no_grad():
        for parameter, weight in zip(net.parameters(), weights):
            parameter.copy_(torch.from_numpy(weight.T.copy()))  # torch keeps Linear weights as (out, in)
    task = TorchClassification(net, OUTPUTS, 0.0, None)
    optimizer, average = make_optimizer(task.parameters(), OPTIM, 0.5), WeightAverage(net, DECAY)

    def as_keras(tensors):
        return [t.detach().numpy().T.copy() for t in tensors]

    steps = []
    for batch in range(len(x)):
        loss, _ = task.training_loss({"images": torch.from_numpy(x[batch]), "labels": torch.from_numpy(y[batch])})
        (loss / ACCUMULATE).backward()
        if (batch + 1) % ACCUMULATE == 0:
            optimizer.step()
            optimizer.zero_grad()
            average.update()
            steps.append(as_keras(net.parameters()))
    return steps, as_keras(average.average())


def _keras_average(x, y, weights):
    """The Keras backend's optimizer with its average, stepping after each accumulation of batches: the average."""
    import keras
    import tensorflow as tf

    from hydrali.backends.keras.optimizers import make_optimizer
    from hydrali.tasks.classification.keras_task import CrossEntropy

    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(inputs)
    net = keras.Model(inputs, keras.layers.Dense(OUTPUTS)(hidden))
    net.set_weights(weights)
    loss_fn, optimizer = CrossEntropy(0.0, None), make_optimizer(OPTIM, 0.5, ACCUMULATE)

    @tf.function
    def train_step(images, labels):  # in a graph, as Keras' fit runs it
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, net(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, net.trainable_variables), net.trainable_variables))

    for batch in range(len(x)):
        train_step(x[batch], y[batch])
    optimizer.finalize_variable_values(net.trainable_variables)  # the average into the network, as fit ends
    return [keras.ops.convert_to_numpy(w) for w in net.trainable_variables]


@pytest.mark.keras
def test_both_backends_keep_the_same_average_of_the_same_accumulated_steps():
    x, y, weights = _step_data()
    steps, torch_average = _torch_average(x, y, weights)
    expected = weight_average(steps, DECAY)
    _assert_differ(expected, steps[-1], "the average is not the last step's weights")
    _assert_close(torch_average, expected, "torch's average")
    _assert_close(_keras_average(x, y, weights), expected, "Keras' average")


def test_a_lightning_checkpoint_holds_the_average_and_a_resume_continues_it():
    import torch

    from hydrali.backends.lightning.module import HydraliModule

    def module():
        net = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.BatchNorm1d(HIDDEN))
        return HydraliModule(net, OPTIM, None, STEPS)

    rng = np.random.default_rng(1)

    def step(modules, steps) -> None:  # the same new weights into each module, then its average's update
        new = [rng.normal(size=p.shape).astype("float32") for p in modules[0].parameters()]
        for trained in modules:
            with torch.no_grad():
                for parameter, weight in zip(trained.parameters(), new):
                    parameter.copy_(torch.from_numpy(weight))
            trained.weight_average.update()
        steps.append(new)

    first, steps = module(), []
    for _ in range(3):
        step([first], steps)
    first.torch_task[1].running_mean.fill_(0.5)  # a statistic: not averaged, saved as it is
    checkpoint = {"state_dict": first.state_dict()}
    first.weight_average.swap_in()  # as during validation, when the best checkpoint is saved
    first.on_save_checkpoint(checkpoint)
    first.weight_average.swap_out()
    names = [name for name, _ in first.named_parameters()]
    _assert_close([checkpoint["state_dict"][n] for n in names], weight_average(steps, DECAY), "the saved weights")
    assert float(checkpoint["state_dict"]["torch_task.1.running_mean"][0]) == 0.5

    resumed = module()
    resumed.on_load_checkpoint(checkpoint)
    resumed.load_state_dict(checkpoint["state_dict"])
    _assert_close([p.detach() for p in resumed.parameters()], steps[-1], "a resume trains the live weights")
    for _ in range(2):
        step([first, resumed], steps)
    for trained in (first, resumed):
        _assert_close([w.detach() for w in trained.weight_average.average()], weight_average(steps, DECAY), "average")


def test_an_average_loaded_before_the_network_moves_follows_it():
    """Lightning loads a checkpoint before its strategy moves the network to the GPU: the average loaded with it must
    follow the network (here: to float64, the move a CPU can show) at the next update, not fail beside it."""
    import torch

    from hydrali.backends.lightning.module import HydraliModule

    def module():
        return HydraliModule(torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN)), OPTIM, None, STEPS)

    first = module()
    first.weight_average.update()
    checkpoint = {"state_dict": first.state_dict()}
    first.on_save_checkpoint(checkpoint)
    resumed = module()
    resumed.on_load_checkpoint(checkpoint)
    resumed.load_state_dict(checkpoint["state_dict"])
    resumed.double()  # the network moves after the checkpoint was loaded
    resumed.weight_average.update()
    resumed.weight_average.swap_in()
    assert all(w.dtype == torch.float64 for w in resumed.weight_average.average())


def test_a_decay_outside_0_to_1_is_one_line(tmp_path):
    fails_with(run_cli("optim.ema_decay=1.5", cwd=tmp_path), "optim.ema_decay=1.5", "between 0 and 1")
