"""Shared fixtures: configs composed through Hydra's compose API, and the CLI run as a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from core.schema import register_schemas

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One data dir for the whole session, so the digits JPEG files are written once."""
    return tmp_path_factory.mktemp("data")


def compose_config(overrides: list[str], root: Path, data_dir: Path, output_dir: Path | None = None):
    """The config `hydrali <overrides>` would run, with its paths under `root` (HydraConfig set, as at run time)."""
    register_schemas()
    GlobalHydra.instance().clear()
    output_dir = output_dir or root / "run"
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={root}", f"paths.data_dir={data_dir}",
                                           f"hydra.run.dir={output_dir}", *overrides],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        del cfg["hydra"]
    return cfg


@pytest.fixture
def make_cfg(tmp_path, data_dir):
    """compose_config bound to this test's tmp dir and the session's data dir."""
    def make(*overrides: str, output_dir: Path | None = None):
        return compose_config(list(overrides), tmp_path, data_dir, output_dir)
    return make


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python -m core <args>` in `cwd`, as a user would run `hydrali`."""
    full_env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def read_summary(output_dir: Path) -> dict:
    """The summary.json a run wrote."""
    return json.loads((Path(output_dir) / "summary.json").read_text())
