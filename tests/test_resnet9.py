"""model=resnet9 (Page's ResNet-9): the same network on both frameworks (torch's weights copied into the Keras model
give its logits), initialised from the same distributions with the same normalization settings, and a layout or an
image size that cannot be built is one line naming the options."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.support.checks import fails_with
from tests.support.cli import run_cli
from tests.support.torch_networks import with_random_normalization


def _torch_network(num_classes: int, layers=(1, 0, 1)):
    """hydrali's torch ResNet-9 with random normalization statistics and scales, in inference mode."""
    import torch

    from hydrali.tasks.classification.torch_model import ResNet9

    torch.manual_seed(0)
    network = with_random_normalization(ResNet9(num_classes, layers=layers))
    for module in network.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.data.uniform_(-1.0, 1.0)  # logits of a size that tells networks apart
    return network


def _torch_weights_in_keras_order(network) -> list[np.ndarray]:
    """The torch network's weights in the order and layout Keras keeps them: each convolution's kernel (HWIO),
    its normalization's scale, shift, mean and variance, then the linear layer's kernel (IO)."""
    import torch

    weights = []
    for module in network.modules():
        if isinstance(module, torch.nn.Conv2d):
            weights.append(module.weight.detach().numpy().transpose(2, 3, 1, 0))
        elif isinstance(module, torch.nn.BatchNorm2d):
            weights += [
                t.detach().numpy() for t in (module.weight, module.bias, module.running_mean, module.running_var)
            ]
        elif isinstance(module, torch.nn.Linear):
            weights.append(module.weight.detach().numpy().T)
    return weights


@pytest.mark.keras
def test_resnet9_is_the_same_network_on_both_frameworks():
    import torch

    from hydrali.tasks.classification.keras_model import ResNet9 as KerasResNet9

    layers = (1, 0, 2)  # a stage with two residual pairs: their order must agree too
    side = 36  # 36 -> 18 -> 9 -> 4: an odd side, where the two frameworks' pooling could round apart
    torch_net = _torch_network(7, layers)
    keras_net = KerasResNet9(7, side, layers=layers)
    keras_weights = [w for layer in keras_net.layers for w in layer.get_weights()]
    torch_weights = _torch_weights_in_keras_order(torch_net)
    assert [w.shape for w in keras_weights] == [w.shape for w in torch_weights]
    keras_net.set_weights(torch_weights)

    images = np.random.default_rng(0).normal(size=(3, side, side, 3)).astype("float32")
    with torch.no_grad():
        expected = torch_net(torch.from_numpy(images.transpose(0, 3, 1, 2).copy())).numpy()
    logits = np.asarray(keras_net(images, training=False))
    assert logits.shape == (3, 7)
    assert np.abs(logits - expected).max() < 1e-4 * max(1.0, np.abs(expected).max())
    assert np.abs(expected).max() > 0.1, "logits large enough for the comparison to mean something"


@pytest.mark.keras
def test_resnet9_starts_from_the_same_weight_distributions_and_normalizes_alike_on_both_frameworks():
    import keras
    import torch

    from hydrali.tasks.classification.keras_model import ResNet9 as KerasResNet9
    from hydrali.tasks.classification.torch_model import ResNet9

    torch_net, keras_net = ResNet9(10), KerasResNet9(10, 32)
    weighted = (torch.nn.Conv2d, torch.nn.Linear)
    torch_kernels = [m.weight.detach().numpy() for m in torch_net.modules() if isinstance(m, weighted)]
    keras_kernels = [np.asarray(layer.kernel) for layer in keras_net.layers if hasattr(layer, "kernel")]
    assert len(torch_kernels) == len(keras_kernels) == 9  # 8 convolutions and the linear layer
    for torch_kernel, keras_kernel in zip(torch_kernels, keras_kernels):
        fan_in = int(np.prod(torch_kernel.shape[1:]))
        bound = 1 / np.sqrt(fan_in)  # torch's default: uniform in +-1/sqrt(fan_in), deviation bound/sqrt(3)
        for kernel in (torch_kernel, keras_kernel):
            assert np.abs(kernel).max() <= bound + 1e-6
            assert abs(kernel.std() / (bound / np.sqrt(3)) - 1) < 0.1

    torch_norms = [m for m in torch_net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    keras_norms = [layer for layer in keras_net.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(torch_norms) == len(keras_norms) == 8
    for torch_norm, keras_norm in zip(torch_norms, keras_norms):
        # torch updates its running statistics by momentum m, Keras keeps 1 - m of them
        assert keras_norm.momentum == pytest.approx(1 - torch_norm.momentum)
        assert keras_norm.epsilon == pytest.approx(torch_norm.eps)


@pytest.mark.keras
def test_images_too_small_for_resnet9_are_one_error_naming_the_options_on_both_frameworks():
    import torch

    from hydrali.core.errors import HydraliError
    from hydrali.tasks.classification.keras_model import ResNet9 as KerasResNet9
    from hydrali.tasks.classification.torch_model import ResNet9

    message = "model=resnet9 with 3 stages (model.layers=[1, 0, 1]) takes images of 8 px and up"
    at_step = "images of 4 px: " + message + " (each stage halves them): raise data.image_size or "
    with pytest.raises(HydraliError, match=re.escape(at_step + "progressive_resizing.start_side")):  # torch, each step
        ResNet9(10)(torch.zeros(1, 3, 4, 4))
    with pytest.raises(HydraliError, match=re.escape("data.image_size=4: " + message)):
        KerasResNet9(10, 4)
    assert ResNet9(10).eval()(torch.zeros(1, 3, 8, 8)).shape == (1, 10), "8 px is the smallest side it takes"


def test_a_resnet9_layout_that_cannot_be_built_is_one_line(tmp_path):
    out = run_cli(
        "model=resnet9",
        "model.layers=[1,1]",
        "tracking=none",
        "epochs=1",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    fails_with(out, "model.widths (4 entries) must have one more than model.layers (2 stages)")
