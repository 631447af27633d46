"""backend=keras as core sees it before TensorFlow loads: its config schema and its entry in the registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydrali.core.contracts.backend import AutoSwitch, BackendSpec


@dataclass
class KerasBackendConfig:
    """conf/backend/keras.yaml: devices and Keras fit options."""

    name: str = "keras"
    devices: Any = "auto"  # auto | a count (hydrali.core.distributed.device_count)
    processes: str = "one"  # one (one process drives the node's replicas) | per_device (hydrali starts one each)
    precision: str = "auto"  # auto | a Precision name (checked by hydrali.core.policies.auto_settings)
    compile: Any = "auto"  # true | false | auto (SPEC's auto_switches)
    xla_cache: Optional[str] = None  # a folder: XLA's compiled steps kept for later runs (backends/keras/xla_cache.py)
    callbacks: Dict[str, Any] = field(default_factory=dict)


SPEC = BackendSpec(
    name="keras",
    framework="keras",
    framework_label="TensorFlow",
    summary="Keras 3 on TensorFlow: MirroredStrategy (MultiWorker under TF_CONFIG or srun), fed by DALI's TF plugin",
    schema=KerasBackendConfig,
    checkpoint_suffix=".weights.h5",
    implementation="hydrali.backends.keras.backend:KerasBackend",
    auto_switches=(AutoSwitch("compile", off_when_deterministic=True),),  # XLA (auto: on a GPU, not deterministic)
    network_key="keras_target",  # a model config's builder of the Keras network
    added_keys={"backend.processes": "one"},  # backend.processes=per_device: one process drove every replica before
    # fit options whose job a core key does on every backend
    replaced_keys={
        "validation_freq": "validate_every",
        "verbose": "progress_bar",
        "keep_checkpoints": "keep_checkpoints",
    },
)
