"""Where DALI and the model run: `pipeline.device` auto | cpu | gpu, resolved without importing torch."""
from __future__ import annotations

from core.errors import HydraliError

DEVICES = ("auto", "cpu", "gpu")


def cuda_device_count() -> int:
    """The number of CUDA devices DALI can see (0 on a machine with no GPU or no driver)."""
    try:
        from nvidia.dali.backend import GetCUDADeviceCount
        return int(GetCUDADeviceCount())
    except Exception:  # no driver, no libcuda: a CPU machine
        return 0


def resolve_device(requested: str) -> str:
    """Turn pipeline.device into "cpu" or "gpu"; asking for gpu on a machine without one is an error."""
    if requested not in DEVICES:
        raise HydraliError(f"pipeline.device={requested!r}: choose one of {', '.join(DEVICES)}")
    if requested == "auto":
        return "gpu" if cuda_device_count() > 0 else "cpu"
    if requested == "gpu" and cuda_device_count() == 0:
        raise HydraliError("pipeline.device=gpu but no CUDA device is visible: use pipeline.device=cpu (or auto)")
    return requested
