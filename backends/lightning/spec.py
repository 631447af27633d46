"""backend=lightning as core sees it before torch loads: its config schema and its entry in the registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydrali.core.config.schema import CompileMode
from hydrali.core.contracts.backend import BackendSpec


@dataclass
class LightningBackendConfig:
    """conf/backend/lightning.yaml: devices, nodes, strategy and Trainer options."""

    name: str = "lightning"
    accelerator: str = "auto"
    devices: Any = "auto"  # auto | a count (hydrali.core.distributed.device_count)
    num_nodes: int = 1
    strategy: str = "auto"
    ddp_bucket_mb: float = 25.0  # DDP's gradient bucket size, in MiB (hydrali.backends.lightning.backend)
    precision: str = "auto"  # auto | a Precision name (checked by hydrali.core.run.auto_settings)
    channels_last: Any = "auto"  # true | false | auto
    compile: Any = False  # true | false | auto (hydrali.core.run.auto_settings)
    compile_mode: CompileMode = CompileMode.default
    compile_fullgraph: bool = False
    compile_dynamic: Optional[bool] = None
    compile_cache: Optional[str] = None  # a folder: torch.compile's code kept for later runs (torch/compile_cache.py)
    save_top_k: int = 1
    callbacks: Dict[str, Any] = field(default_factory=dict)
    trainer: Dict[str, Any] = field(default_factory=dict)


SPEC = BackendSpec(
    name="lightning",
    framework="torch",
    framework_label="torch",
    summary="PyTorch Lightning: DDP across devices and nodes, fed by DALI's PyTorch plugin",
    schema=LightningBackendConfig,
    checkpoint_suffix=".ckpt",
    implementation="hydrali.backends.lightning.backend:LightningBackend",
    resumes_reader_position=True,  # with pipeline.checkpointing (ResumableDaliLoader)
)
