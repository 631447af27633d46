"""model=resnet9 (Page's ResNet-9): the same network on both frameworks (torch's weights copied into the Keras model
give its logits), initialised from the same distributions, and a layout that cannot be built is one line."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.checks import fails_with
from tests.support.cli import run_cli


def _torch_network(num_classes: int, layers=(1, 0, 1)):
    """hydrali's torch ResNet-9 with random normalization statistics and scales, in inference mode."""
    import torch

    from hydrali.tasks.classification.torch_model import ResNet9

    torch.manual_seed(0)
    network = ResNet9(num_classes, layers=layers)
    for module in network.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 2.0)
        elif isinstance(module, torch.nn.Linear):
            module.weight.data.uniform_(-1.0, 1.0)  # logits of a size that tells networks apart
    return network.eval()


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
    torch_net = _torch_network(7, layers)
    keras_net = KerasResNet9(7, 32, layers=layers)
    keras_weights = [w for layer in keras_net.layers for w in layer.get_weights()]
    torch_weights = _torch_weights_in_keras_order(torch_net)
    assert [w.shape for w in keras_weights] == [w.shape for w in torch_weights]
    keras_net.set_weights(torch_weights)

    images = np.random.default_rng(0).normal(size=(3, 32, 32, 3)).astype("float32")
    with torch.no_grad():
        expected = torch_net(torch.from_numpy(images.transpose(0, 3, 1, 2).copy())).numpy()
    logits = np.asarray(keras_net(images, training=False))
    assert logits.shape == (3, 7)
    assert np.abs(logits - expected).max() < 1e-4 * max(1.0, np.abs(expected).max())
    assert np.abs(expected).max() > 0.1, "logits large enough for the comparison to mean something"


@pytest.mark.keras
def test_resnet9_starts_from_the_same_weight_distributions_on_both_frameworks():
    import torch

    from hydrali.tasks.classification.keras_model import ResNet9 as KerasResNet9
    from hydrali.tasks.classification.torch_model import ResNet9

    torch_kernels = [m.weight.detach().numpy() for m in ResNet9(10).modules() if isinstance(m, torch.nn.Conv2d)]
    keras_kernels = [np.asarray(layer.kernel) for layer in KerasResNet9(10, 32).layers if hasattr(layer, "kernel")]
    assert len(torch_kernels) + 1 == len(keras_kernels)  # Keras' list ends with the linear layer's kernel
    for torch_kernel, keras_kernel in zip(torch_kernels, keras_kernels):
        fan_in = int(np.prod(torch_kernel.shape[1:]))
        bound = 1 / np.sqrt(fan_in)  # torch's default: uniform in +-1/sqrt(fan_in), deviation bound/sqrt(3)
        for kernel in (torch_kernel, keras_kernel):
            assert np.abs(kernel).max() <= bound + 1e-6
            assert abs(kernel.std() / (bound / np.sqrt(3)) - 1) < 0.1


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
