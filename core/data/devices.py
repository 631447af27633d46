"""Where DALI runs: `pipeline.device` auto | cpu | gpu, resolved without importing torch or TensorFlow.

The training device is the backend's (Lightning's accelerator, the GPUs TensorFlow sees): a DALI
pipeline on the CPU may feed a model on a GPU. `auto` puts DALI on the GPU when DALI sees one;
when the framework sees a GPU that DALI does not (a driver or CUDA library mismatch), it says so.
"""

from __future__ import annotations

import logging

from hydrali.core.config.schema import Device
from hydrali.core.errors import HydraliError

log = logging.getLogger(__name__)


def dali_cuda_devices() -> tuple[int, str]:
    """The number of CUDA devices DALI can see, and why it sees none (empty when it sees some)."""
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        count = int(GetCUDADeviceCount())
    except Exception as err:  # no driver, no libcuda, a CUDA version DALI was not built for
        return 0, f"DALI cannot use CUDA: {err}".strip()
    return count, "" if count else "DALI finds no CUDA device (no NVIDIA GPU or driver on this machine)"


def resolve_device(requested: str, framework_gpus: int = 0, framework: str = "the framework") -> str:
    """Turn pipeline.device (a Device value) into "cpu" or "gpu", given how many GPUs the training framework sees."""
    device = Device.of(requested, "pipeline.device")
    if device is Device.cpu:
        return Device.cpu.value
    count, why_none = dali_cuda_devices()
    if count > 0 and device is Device.auto and framework_gpus == 0:
        log.warning(
            "pipeline.device=auto: DALI sees %d GPU(s) but %s sees none, so DALI runs on the CPU; "
            "install %s with CUDA to train on the GPU",
            count,
            framework,
            framework,
        )
        return Device.cpu.value
    if count > 0:
        return Device.gpu.value
    if device is Device.gpu:
        raise HydraliError(
            f"pipeline.device=gpu but {why_none}: use pipeline.device=cpu, or install the "
            f"nvidia-dali-cudaXXX package that matches the driver"
        )
    if framework_gpus > 0:
        log.warning(
            "pipeline.device=auto: %s sees %d GPU(s) but %s, so DALI runs on the CPU (training stays on "
            "the GPU); install the nvidia-dali-cudaXXX package that matches the driver to decode on the GPU",
            framework,
            framework_gpus,
            why_none,
        )
    return Device.cpu.value
