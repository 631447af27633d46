"""`hydrali ui [overrides]`: MLflow's UI over the store hydrali is configured to write (tracking.uri), on
tracking.ui_host:tracking.ui_port (127.0.0.1:5000 by default). The same overrides as a run choose the store,
e.g. `hydrali ui paths.root=/experiments` or `hydrali ui tracking.ui_port=5001`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hydrali.core.errors import HydraliError


def tracking_settings(overrides: list[str]) -> tuple[str, str, int]:
    """(store uri, host, port) of the config that `hydrali <overrides>` would run."""
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_module(config_module="hydrali.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # so that ${hydra:runtime.cwd} in paths.root resolves
    if not cfg.tracking.enabled or not cfg.tracking.uri:
        raise HydraliError("tracking is off (tracking=none): there is no MLflow store to browse")
    return str(cfg.tracking.uri), str(cfg.tracking.ui_host), int(cfg.tracking.ui_port)


def serve(overrides: list[str]) -> None:
    """Replace this process with `mlflow ui` over the configured store (Ctrl+C stops it)."""
    uri, host, port = tracking_settings(overrides)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        raise HydraliError(
            f"no MLflow store at {uri} yet: run hydrali first, or point tracking.uri (or "
            f"paths.root) at an existing store"
        )
    print(f"hydrali: MLflow UI on http://{host}:{port} over {uri} (Ctrl+C stops it)", flush=True)
    os.execv(
        sys.executable,
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)],
    )
