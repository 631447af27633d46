"""backend=plain as core sees it before torch loads: its schema and spec, and the installed distribution that
registers it (an entry point of group hydrali.backends), as a third party would ship it: no file of hydrali names it.

Light on purpose: every hydrali command reads every registered spec (--help, the config schema), and a Keras run
must not load torch, so the training loop lives apart, in tests/support/plain_torch_backend.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hydrali.core.contracts.backend import BackendSpec, Capability

REPO = Path(__file__).resolve().parents[2]


@dataclass
class PlainBackendConfig:
    """backend=plain: one process on the CPU, float32, eager (no precision, compile or callbacks to choose)."""

    name: str = "plain"
    devices: int = 1  # only 1: more is refused naming the key


SPEC = BackendSpec(
    name="plain",
    framework="torch",
    framework_label="torch",
    summary="a plain PyTorch loop on the CPU (a test's third backend: one process, float32)",
    schema=PlainBackendConfig,
    checkpoint_suffix=".pt",
    implementation="tests.support.plain_torch_backend:PlainBackend",
    supports=frozenset(Capability) - {Capability.progressive_resizing, Capability.start_from_run},  # one size, fresh
)


def install(site: Path) -> dict[str, str]:
    """Install backend=plain into the folder `site` (a distribution's metadata with its entry point) and return
    the environment of a Python that has it: `site` and this checkout on PYTHONPATH."""
    dist_info = Path(site) / "hydrali_plain_backend-0.1.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: hydrali-plain-backend\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[hydrali.backends]\nplain = tests.support.plain_torch_spec:SPEC\n")
    paths = [str(site), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
