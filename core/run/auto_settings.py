"""The speed settings a user may leave to hydrali (`auto`), decided once in core for the device a backend trains
on, so that every backend picks the same for the same machine:

- backend.precision=auto: bf16-mixed on a GPU with bfloat16 units (compute capability 8.0 and later: A100, H100,
  L4, ...), 16-mixed (float16 with loss scaling) on older GPUs, 32-true on CPUs;
- backend.compile=auto: compiled (torch.compile on Lightning, XLA on Keras) on a GPU, unless deterministic=true;
  eager on CPUs;
- backend.channels_last=auto (Lightning): channels-last memory on a GPU.

The run's record (run.json, .hydra/config.yaml) keeps `auto`, so a run resumed on another machine decides again;
what it decided is logged in one line, and MLflow's params hold the decided values.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from hydrali.core.config.schema import Precision
from hydrali.core.contracts.backend import TrainingDevice
from hydrali.core.distributed.device_count import devices_setting
from hydrali.core.errors import HydraliError

AUTO = "auto"
BF16_CAPABILITY = (8, 0)  # the first CUDA compute capability with bfloat16 tensor cores (Ampere)
SWITCHES = ("compile", "channels_last")  # backend keys that take true | false | auto (those a backend declares)
_SWITCH_WORDS = {"true": True, "false": False, AUTO: None}


def precision_setting(value: Any) -> str:
    """backend.precision as typed: `auto` or one of Precision's names; any other value is an error naming them."""
    text = str(value)
    if text != AUTO and text not in Precision.values():
        raise HydraliError(f"backend.precision={value!r}: choose one of {AUTO}, {', '.join(Precision.values())}")
    return text


def switch_setting(value: Any, key: str) -> bool | None:
    """A true | false | auto backend key as typed: True, False, or None for auto; any other value is an error."""
    if isinstance(value, bool):
        return value
    word = str(value).lower()
    if word not in _SWITCH_WORDS:
        raise HydraliError(f"backend.{key}={value!r}: choose one of true, false, {AUTO}")
    return _SWITCH_WORDS[word]


def check_backend_settings(backend: DictConfig) -> None:
    """Fail, naming the key and its choices, when backend.precision, backend.devices or a true | false | auto key
    holds another value (the schema types them loosely so that `auto`, true and false can all be typed), or when
    backend.ddp_bucket_mb is not above 0."""
    if "precision" in backend:  # a backend of another package may declare none of these keys
        precision_setting(backend.precision)
    if "devices" in backend:
        devices_setting(backend.devices)
    for key in SWITCHES:
        if key in backend:
            switch_setting(backend[key], key)
    if "ddp_bucket_mb" in backend and not backend.ddp_bucket_mb > 0:
        raise HydraliError(f"backend.ddp_bucket_mb={backend.ddp_bucket_mb}: DDP's gradient buckets need a size above 0")


def auto_precision(device: TrainingDevice) -> str:
    """The precision `auto` means on `device`."""
    if device.kind != "gpu":
        return "32-true"
    if device.capability is not None and tuple(device.capability) >= BF16_CAPABILITY:
        return "bf16-mixed"
    return "16-mixed"


def auto_switch(key: str, device: TrainingDevice, deterministic: bool) -> bool:
    """What `auto` means for the true | false | auto key `key` on `device`."""
    if key == "compile":
        return device.kind == "gpu" and not deterministic
    return device.kind == "gpu"  # channels_last


def resolve(cfg: DictConfig, device: TrainingDevice) -> dict[str, Any]:
    """Replace every `auto` speed setting of cfg.backend by what it means on `device` (the others become plain
    values: true/false as booleans); return {dotted key: decided value} of those that were `auto`."""
    backend, decided = cfg.backend, {}
    if "precision" in backend and precision_setting(backend.precision) == AUTO:
        backend.precision = decided["backend.precision"] = auto_precision(device)
    for key in SWITCHES:
        if key not in backend:
            continue
        value = switch_setting(backend[key], key)
        if value is None:
            value = decided[f"backend.{key}"] = auto_switch(key, device, bool(cfg.get("deterministic", False)))
        backend[key] = value
    return decided


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def describe(decided: dict[str, Any], device: TrainingDevice) -> str:
    """One log line: what `auto` became, and on which device."""
    where = device.name
    if device.capability:
        where += f" (compute capability {'.'.join(map(str, device.capability))})"
    settings = ", ".join(f"{key}={_shown(value)}" for key, value in decided.items())
    return f"auto settings on {where}: {settings}"
