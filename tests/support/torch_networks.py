"""Torch networks made to tell weight transfers apart: normalization statistics and scales away from their defaults."""

from __future__ import annotations


def with_random_normalization(network):
    """`network` (a torch nn.Module) with every BatchNorm2d's scale, shift, running mean and variance drawn away from
    their defaults (from torch's current random state), in inference mode."""
    import torch

    for module in network.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 2.0)
    return network.eval()
