"""hydrali.core.optim.optimizer's semantics, the same on both backends: the same weights after the same steps, the
same loss."""

import numpy as np
import pytest

from tests.support.settings import optim_settings

pytestmark = pytest.mark.keras

CLASSES, FEATURES, HIDDEN, BATCH = 5, 12, 16, 8


def _optim(name: str, **changes):
    base = {"name": name, "weight_decay": 1e-2, "momentum": 0.9, "nesterov": True, "betas": [0.9, 0.999]}
    return optim_settings(**{**base, **changes})


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=(BATCH, 1)).astype("int32")
    w1 = (rng.normal(size=(FEATURES, HIDDEN)) * 0.3).astype("float32")
    b1 = rng.normal(size=(HIDDEN,)).astype("float32") * 0.1
    w2 = (rng.normal(size=(HIDDEN, CLASSES)) * 0.3).astype("float32")
    b2 = rng.normal(size=(CLASSES,)).astype("float32") * 0.1
    return x, y, [w1, b1, w2, b2]


def torch_steps(optim, weights, x, y, lr, steps, label_smoothing, backbone=False, class_weights=None):
    """The Lightning backend's optimizer and the torch task's loss, for `steps` steps on one batch."""
    import torch

    from hydrali.backends.torch.optim import make_optimizer
    from hydrali.tasks.classification.torch_task import TorchClassification

    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))
    with torch.no_grad():  # torch keeps Linear weights as (out, in)
        net[0].weight.copy_(torch.from_numpy(weights[0].T)), net[0].bias.copy_(torch.from_numpy(weights[1]))
        net[2].weight.copy_(torch.from_numpy(weights[2].T)), net[2].bias.copy_(torch.from_numpy(weights[3]))
    task = TorchClassification(net, CLASSES, label_smoothing, class_weights)
    opt = make_optimizer(task.parameters(), optim, lr, list(net[0].parameters()) if backbone else ())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss, _ = task.training_loss({"images": torch.from_numpy(x), "labels": torch.from_numpy(y)})
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    out = [net[0].weight.T, net[0].bias, net[2].weight.T, net[2].bias]
    return [t.detach().numpy() for t in out], losses


def keras_steps(optim, weights, x, y, lr, steps, label_smoothing, backbone=False, class_weights=None):
    """The Keras backend's optimizer and the Keras task's loss, for `steps` steps on one batch."""
    import keras
    import tensorflow as tf

    from hydrali.backends.keras.optimizers import make_optimizer
    from hydrali.tasks.classification.keras_task import CrossEntropy

    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(inputs)
    net = keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))
    net.set_weights(weights)
    loss_fn = CrossEntropy(label_smoothing, class_weights)
    opt = make_optimizer(optim, lr)
    if backbone:  # the first Dense is the backbone (as the Keras backend does before building the optimizer)
        opt.scale_lr(net.layers[1].trainable_variables, optim.backbone_lr_mult)
    losses = []
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, net(x, training=True))
        grads = tape.gradient(loss, net.trainable_variables)
        opt.apply_gradients(zip(grads, net.trainable_variables))
        losses.append(float(loss))
    return [keras.ops.convert_to_numpy(w) for w in net.weights], losses


@pytest.mark.parametrize(
    "optim",
    [
        _optim("sgd"),
        _optim("sgd", nesterov=False),
        _optim("adamw"),
        _optim("sgd", weight_decay_on="all"),
        _optim("adamw", weight_decay_on="all"),
    ],
    ids=["sgd-nesterov", "sgd", "adamw", "sgd-decay-all", "adamw-decay-all"],
)
def test_both_backends_make_the_same_steps_with_weight_decay(optim):
    x, y, weights = _data()
    lr = 0.1 if optim.name == "sgd" else 0.01
    torch_w, torch_loss = torch_steps(optim, weights, x, y, lr, 3, 0.0)
    keras_w, keras_loss = keras_steps(optim, weights, x, y, lr, 3, 0.0)
    assert any(not np.allclose(a, b) for a, b in zip(weights, torch_w)), "the steps changed the weights"
    for t, k in zip(torch_w, keras_w):
        np.testing.assert_allclose(k, t, atol=1e-5, rtol=0)
    np.testing.assert_allclose(keras_loss, torch_loss, atol=1e-5, rtol=0)


def test_weight_decay_is_coupled_on_sgd_and_spares_biases():
    # one step from zero gradient is impossible; instead compare decay 0 and decay 0.5 after one step:
    # coupled decay moves a kernel by lr * wd * w exactly (no momentum history yet), a bias not at all
    x, y, weights = _data()
    plain, _ = keras_steps(_optim("sgd", weight_decay=0.0), weights, x, y, 0.1, 1, 0.0)
    decayed, _ = keras_steps(_optim("sgd", weight_decay=0.5), weights, x, y, 0.1, 1, 0.0)
    # Nesterov with an empty buffer: step = g + 0.9 * g = 1.9 g, so the decay term is 1.9 * lr * wd * w
    np.testing.assert_allclose(plain[0] - decayed[0], 1.9 * 0.1 * 0.5 * weights[0], atol=1e-5)
    np.testing.assert_allclose(plain[1], decayed[1], atol=1e-7)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_weight_decay_on_all_decays_the_biases_too_on_both_backends(name):
    # one step of decay 0 against decay 0.5: with weight_decay_on=all a bias moves by the decay term as a kernel
    # does (SGD: coupled, 1.9 * lr * wd * b as above; AdamW: decoupled, lr * wd * b); with kernels it does not move
    x, y, weights = _data()
    lr = 0.1 if name == "sgd" else 0.01
    term = {"sgd": 1.9 * lr * 0.5, "adamw": lr * 0.5}[name]
    for steps in (torch_steps, keras_steps):
        plain, _ = steps(_optim(name, weight_decay=0.0), weights, x, y, lr, 1, 0.0)
        kernels, _ = steps(_optim(name, weight_decay=0.5), weights, x, y, lr, 1, 0.0)
        every, _ = steps(_optim(name, weight_decay=0.5, weight_decay_on="all"), weights, x, y, lr, 1, 0.0)
        for bias in (1, 3):
            np.testing.assert_allclose(kernels[bias], plain[bias], atol=1e-7)
            np.testing.assert_allclose(plain[bias] - every[bias], term * weights[bias], atol=1e-5)
        np.testing.assert_allclose(every[0], kernels[0], atol=1e-6)  # a kernel decays either way


def test_label_smoothing_gives_the_same_loss_and_the_same_step_on_both_backends():
    x, y, weights = _data()
    optim = _optim("sgd", weight_decay=1e-4)
    torch_w, torch_loss = torch_steps(optim, weights, x, y, 0.1, 1, 0.1)
    keras_w, keras_loss = keras_steps(optim, weights, x, y, 0.1, 1, 0.1)
    _, unsmoothed = torch_steps(optim, weights, x, y, 0.1, 1, 0.0)
    assert torch_loss[0] != pytest.approx(unsmoothed[0]), "smoothing changes the loss"
    assert keras_loss[0] == pytest.approx(torch_loss[0], abs=1e-6)
    for t, k in zip(torch_w, keras_w):
        np.testing.assert_allclose(k, t, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_a_backbone_lr_multiplier_makes_the_same_steps_on_both_backends(name):
    x, y, weights = _data()
    lr = 0.1 if name == "sgd" else 0.01
    slow = _optim(name, backbone_lr_mult=0.1)
    torch_w, torch_loss = torch_steps(slow, weights, x, y, lr, 3, 0.0, backbone=True)
    keras_w, keras_loss = keras_steps(slow, weights, x, y, lr, 3, 0.0, backbone=True)
    for t, k in zip(torch_w, keras_w):
        np.testing.assert_allclose(k, t, atol=1e-5, rtol=0)
    np.testing.assert_allclose(keras_loss, torch_loss, atol=1e-5, rtol=0)
    # one step: the backbone (first layer) moves by a tenth of what it moves at the head's lr, the head the same
    once, _ = torch_steps(slow, weights, x, y, lr, 1, 0.0, backbone=True)
    full, _ = torch_steps(_optim(name), weights, x, y, lr, 1, 0.0)
    for layer in (0, 1):
        np.testing.assert_allclose(once[layer] - weights[layer], 0.1 * (full[layer] - weights[layer]), atol=1e-6)
    np.testing.assert_allclose(once[2], full[2], atol=1e-7)


def _weighted_loss(x, y, weights, class_weights, label_smoothing: float) -> float:
    """hydrali.core.optim.optimizer's class-weighted loss of the first step, in NumPy: the mean over the samples of
    each sample's smoothed cross-entropy times its class's weight."""
    w1, b1, w2, b2 = weights
    logits = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    log_p = logits - logits.max(1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(1, keepdims=True))
    labels = y.reshape(-1)
    target = (1 - label_smoothing) * np.eye(CLASSES)[labels] + label_smoothing / CLASSES
    return float(np.mean(np.asarray(class_weights)[labels] * -(target * log_p).sum(1)))


def test_class_weights_give_the_same_loss_and_the_same_steps_on_both_backends():
    x, y, weights = _data()
    optim, class_weights = _optim("sgd"), (0.5, 2.0, 1.0, 3.0, 0.25)
    torch_w, torch_loss = torch_steps(optim, weights, x, y, 0.1, 3, 0.1, class_weights=class_weights)
    keras_w, keras_loss = keras_steps(optim, weights, x, y, 0.1, 3, 0.1, class_weights=class_weights)
    _, unweighted = torch_steps(optim, weights, x, y, 0.1, 1, 0.1)
    expected = _weighted_loss(x, y, weights, class_weights, 0.1)
    assert expected != pytest.approx(unweighted[0], abs=1e-3), "the weights change the loss"
    assert torch_loss[0] == pytest.approx(expected, abs=1e-5)
    np.testing.assert_allclose(keras_loss, torch_loss, atol=1e-5, rtol=0)
    for t, k in zip(torch_w, keras_w):
        np.testing.assert_allclose(k, t, atol=1e-5, rtol=0)
