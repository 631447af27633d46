"""What this machine offers the benchmark: its cores, its usable GPUs and whether the Keras side is installed."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from hydrali.core.contracts.backend import TrainingDevice


@dataclass(frozen=True)
class Machine:
    """What this machine offers the benchmark."""

    cores: int
    gpus: int  # CUDA devices DALI and torch can both use
    no_gpu: str  # why there is none ("" when there is one)
    tensorflow: bool  # TensorFlow and DALI's TensorFlow plugin installed
    device: TrainingDevice  # what training runs on (torch's view; the `auto` settings are decided for it)


def detect_machine() -> Machine:
    """Cores, usable GPUs (DALI's and torch's view) and whether the Keras side is installed."""
    import torch

    from hydrali.backends.torch.device import training_device_of
    from hydrali.core.data.devices import dali_cuda_devices

    dali, why = dali_cuda_devices()
    if dali and not torch.cuda.is_available():
        dali, why = 0, "torch sees no CUDA device"
    try:
        tf = (
            importlib.util.find_spec("tensorflow") is not None
            and importlib.util.find_spec("nvidia.dali.plugin.tf") is not None
        )
    except (ImportError, ValueError):
        tf = False
    device = training_device_of(torch.device("cuda", 0) if dali else torch.device("cpu"))
    return Machine(cores=os.cpu_count() or 1, gpus=dali, no_gpu=why, tensorflow=tf, device=device)
