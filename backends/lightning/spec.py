"""backend=lightning as core sees it before torch loads: its config schema and its entry in the registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydrali.core.config.schema import CompileMode
from hydrali.core.contracts.backend import AutoSwitch, BackendSpec
from hydrali.core.errors import HydraliError


@dataclass
class LightningBackendConfig:
    """conf/backend/lightning.yaml: devices, nodes, strategy and Trainer options."""

    name: str = "lightning"
    accelerator: str = "auto"
    devices: Any = "auto"  # auto | a count (hydrali.core.distributed.device_count)
    num_nodes: int = 1
    strategy: str = "auto"
    ddp_bucket_mb: float = 25.0  # DDP's gradient bucket size, in MiB (hydrali.backends.lightning.backend)
    precision: str = "auto"  # auto | a Precision name (checked by hydrali.core.policies.auto_settings)
    channels_last: Any = "auto"  # true | false | auto (SPEC's auto_switches)
    compile: Any = False  # true | false | auto (SPEC's auto_switches)
    compile_mode: CompileMode = CompileMode.default
    compile_fullgraph: bool = False
    compile_dynamic: Optional[bool] = None
    compile_cache: Optional[str] = None  # a folder: torch.compile's code kept for later runs (torch/compile_cache.py)
    callbacks: Dict[str, Any] = field(default_factory=dict)
    trainer: Dict[str, Any] = field(default_factory=dict)


def check_settings(backend) -> None:
    """backend.ddp_bucket_mb is above 0 (a HydraliError naming it otherwise)."""
    if "ddp_bucket_mb" in backend and not backend.ddp_bucket_mb > 0:
        raise HydraliError(f"backend.ddp_bucket_mb={backend.ddp_bucket_mb}: DDP's gradient buckets need a size above 0")


SPEC = BackendSpec(
    name="lightning",
    framework="torch",
    framework_label="torch",
    summary="PyTorch Lightning: DDP across devices and nodes, fed by DALI's PyTorch plugin",
    schema=LightningBackendConfig,
    checkpoint_suffix=".ckpt",
    implementation="hydrali.backends.lightning.backend:LightningBackend",
    resumes_reader_position=True,  # with pipeline.checkpointing (ResumableDaliLoader)
    # torch.compile (auto: on a GPU, not under deterministic=true) and channels-last memory (auto: on a GPU)
    auto_switches=(AutoSwitch("compile", off_when_deterministic=True), AutoSwitch("channels_last")),
    # Trainer options whose job a core key does on every backend (gradient accumulation: the plan's global batch and
    # lr count optim's; the validation cadence; the progress display) and the checkpoints' retention
    replaced_keys={
        "trainer.accumulate_grad_batches": "optim.accumulate_grad_batches",
        "trainer.check_val_every_n_epoch": "validate_every",
        "trainer.enable_progress_bar": "progress_bar",
        "save_top_k": "keep_checkpoints",
    },
    check_settings=check_settings,
    sweep_launch_hint=(
        "Lightning's launcher re-runs the command line (Lightning issue 11300): pass backend.strategy=ddp or auto "
        "(hydrali then starts each job's processes), or "
    ),
)
