"""The torch device a backend trains on, as core's `auto` settings see it, and waiting for its queued work."""

from __future__ import annotations

import torch

from hydrali.core.contracts.backend import TrainingDevice


def training_device_of(device: torch.device) -> TrainingDevice:
    """`device` as core's `auto` settings need it: a CUDA device's name and compute capability, or the CPU."""
    if device.type != "cuda":
        return TrainingDevice("cpu", "CPU")
    return TrainingDevice("gpu", torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device)))


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def use_cpu_threads(threads: int) -> None:
    """torch's intra-op thread pool of this process: `threads` threads."""
    torch.set_num_threads(threads)
