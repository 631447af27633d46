"""The speed settings a user may leave to hydrali (`auto`), decided once in core for the device a backend trains
on, so that every backend picks the same for the same machine:

- backend.precision=auto: bf16-mixed on a GPU with bfloat16 units (compute capability 8.0 and later: A100, H100,
  L4, ...), 16-mixed (float16 with loss scaling) on older GPUs, 32-true on CPUs;
- a backend's true | false | auto keys (its spec's `auto_switches`, e.g. backend.compile: torch.compile on
  Lightning, XLA on Keras): true on a GPU (compile: unless deterministic=true), false on CPUs.

The run's record (run.json, .hydra/config.yaml) keeps `auto`, so a run resumed on another machine decides again;
what it decided is logged in one line, and MLflow's params hold the decided values.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from hydrali.core.config.schema import Precision
from hydrali.core.contracts.backend import AutoSwitch, BackendSpec, TrainingDevice
from hydrali.core.contracts.registry import backend_specs
from hydrali.core.distributed.device_count import devices_setting
from hydrali.core.errors import HydraliError

AUTO = "auto"
BF16_CAPABILITY = (8, 0)  # the first CUDA compute capability with bfloat16 tensor cores (Ampere)
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


def _spec(backend: DictConfig) -> BackendSpec | None:
    return backend_specs().get(str(backend.get("name")))


def check_backend_settings(backend: DictConfig) -> None:
    """Fail, naming the key and its choices, when backend.precision, backend.devices or one of the backend's
    true | false | auto keys holds another value (the schema types them loosely so that `auto`, true and false can
    all be typed), or when the backend's own check of its settings fails (its spec's check_settings)."""
    if "precision" in backend:  # a backend of another package may declare none of these keys
        precision_setting(backend.precision)
    if "devices" in backend:
        devices_setting(backend.devices)
    spec = _spec(backend)
    if spec is None:
        return
    for switch in spec.auto_switches:
        if switch.key in backend:
            switch_setting(backend[switch.key], switch.key)
    if spec.check_settings is not None:
        spec.check_settings(backend)


def auto_precision(device: TrainingDevice) -> str:
    """The precision `auto` means on `device`."""
    if device.kind != "gpu":
        return "32-true"
    if device.capability is not None and tuple(device.capability) >= BF16_CAPABILITY:
        return "bf16-mixed"
    return "16-mixed"


def auto_switch(switch: AutoSwitch, device: TrainingDevice, deterministic: bool) -> bool:
    """What `auto` means for a backend's true | false | auto key on `device`."""
    return device.kind == "gpu" and not (deterministic and switch.off_when_deterministic)


def resolve(cfg: DictConfig, device: TrainingDevice) -> dict[str, Any]:
    """Replace every `auto` speed setting of cfg.backend by what it means on `device` (the others become plain
    values: true/false as booleans); return {dotted key: decided value} of those that were `auto`."""
    backend, decided = cfg.backend, {}
    if "precision" in backend and precision_setting(backend.precision) == AUTO:
        backend.precision = decided["backend.precision"] = auto_precision(device)
    spec = _spec(backend)
    for switch in spec.auto_switches if spec is not None else ():
        if switch.key not in backend:
            continue
        value = switch_setting(backend[switch.key], switch.key)
        if value is None:
            deterministic = bool(cfg.get("deterministic", False))
            value = decided[f"backend.{switch.key}"] = auto_switch(switch, device, deterministic)
        backend[switch.key] = value
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
