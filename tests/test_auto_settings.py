"""`auto` speed settings (backend.precision, backend.compile, backend.channels_last): one rule in core for both
backends. On this CPU machine the default runs of both backends train in float32 without compiling, their record
keeps `auto` (a resume on a GPU machine decides again) and MLflow holds what was decided; on GPUs the rule picks
bf16 where the GPU has it, float16 with loss scaling where it has not."""

import json

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from hydrali.core.contracts.backend import TrainingDevice
from hydrali.core.errors import HydraliError
from hydrali.core.policies import auto_settings
from tests.support.checks import fails_with
from tests.support.cli import run_cli

H100 = TrainingDevice("gpu", "NVIDIA H100 80GB HBM3", (9, 0))
V100 = TrainingDevice("gpu", "Tesla V100-SXM2-16GB", (7, 0))
CPU = TrainingDevice("cpu", "CPU")


@pytest.fixture(scope="module")
def both(trained_on_both):
    """The default experiment run by each backend from the command line (tests/support/both_backends.py)."""
    return trained_on_both


@pytest.mark.slow
def test_on_a_cpu_both_backends_default_to_float32_without_compiling(both):
    tmp_path, (lightning_out, lightning), (keras_out, keras) = both
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    for backend, out, summary in (("lightning", lightning_out, lightning), ("keras", keras_out, keras)):
        recorded = json.loads((tmp_path / backend / "run.json").read_text())["config"]["backend"]
        assert recorded["precision"] == "auto", "the record keeps auto: a resume on a GPU decides again"
        params = client.get_run(summary["mlflow_run_id"]).data.params
        assert params["backend.precision"] == "32-true"
        assert summary["compiled"] is False, f"{backend} ran compiled on a CPU"
        log = out.stdout + out.stderr
        assert "auto settings on CPU: backend.precision=32-true" in log
    assert recorded["compile"] == "auto"  # Keras' default
    assert params["backend.compile"] == "False"  # Keras built its model without XLA (summary's compiled, above)
    lightning_params = client.get_run(lightning["mlflow_run_id"]).data.params
    assert lightning_params["backend.channels_last"] == "False"


def _backend(**values):
    """A run's config with backend=lightning's `values` (its spec declares compile and channels_last as switches)."""
    return OmegaConf.create({"deterministic": False, "backend": {"name": "lightning", "precision": "auto", **values}})


def test_the_rule_picks_bf16_where_the_gpu_has_it_float16_where_not_and_compiles_on_gpus_only():
    for device, precision in ((H100, "bf16-mixed"), (V100, "16-mixed"), (CPU, "32-true")):
        cfg = _backend(compile="auto", channels_last="auto")
        decided = auto_settings.resolve(cfg, device)
        gpu = device.kind == "gpu"
        assert decided == {"backend.precision": precision, "backend.compile": gpu, "backend.channels_last": gpu}
        assert (cfg.backend.precision, cfg.backend.compile, cfg.backend.channels_last) == (precision, gpu, gpu)
    cfg = _backend(compile="auto")
    cfg.deterministic = True
    assert auto_settings.resolve(cfg, H100)["backend.compile"] is False, "XLA and torch.compile are not deterministic"


def test_what_a_user_typed_is_kept():
    cfg = _backend(compile=False, channels_last="true")
    cfg.backend.precision = "16-mixed"
    assert auto_settings.resolve(cfg, H100) == {}
    assert (cfg.backend.precision, cfg.backend.compile, cfg.backend.channels_last) == ("16-mixed", False, True)


def test_a_value_that_is_no_choice_is_one_line_naming_the_choices(tmp_path):
    with pytest.raises(HydraliError, match="backend.compile='maybe': choose one of true, false, auto"):
        auto_settings.check_backend_settings(_backend(compile="maybe").backend)
    fails_with(
        run_cli("backend.precision=fp8", cwd=tmp_path),
        "backend.precision='fp8': choose one of auto, 32-true, bf16-mixed, 16-mixed",
    )
    fails_with(
        run_cli("backend.ddp_bucket_mb=0", cwd=tmp_path),
        "backend.ddp_bucket_mb=0.0: DDP's gradient buckets need a size above 0",
    )
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written == [], f"a refused run wrote {written}"


def _setup_commands(tmp_path, with_driver: bool) -> str:
    """What `make setup` would run (make -n, from a scratch venv path), on a machine with or without nvidia-smi."""
    import os
    import shutil
    import subprocess

    from tests.support.cli import REPO

    bin_dir = tmp_path / ("gpu-bin" if with_driver else "cpu-bin")
    bin_dir.mkdir()
    for tool in ("sh", "make", "python3"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    if with_driver:  # the Makefile asks only whether nvidia-smi is on PATH
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    out = subprocess.run(
        ["make", "-n", "setup", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_set_up_installs_tensorflow_with_cuda_and_an_xla_ready_cudnn_only_where_a_driver_is(tmp_path):
    import tomllib

    from tests.support.cli import REPO

    cpu, gpu = _setup_commands(tmp_path, False), _setup_commands(tmp_path, True)
    assert '-e ".[test,keras]"' in cpu and "keras-cuda" not in cpu and "torch==2.14.1" in cpu
    assert '-e ".[test,keras-cuda]"' in gpu
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "hydrali[keras]" in extras["keras-cuda"] and "nvidia-cudnn-cu12>=9.19" in extras["keras-cuda"]
    assert any(spec.startswith("tensorflow[and-cuda]") for spec in extras["keras-cuda"])
