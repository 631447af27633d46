"""Composition: the task picks its defaults, the command line wins, --help and --cfg work."""

from pathlib import Path

import pytest
import yaml

from tests.support.cli import REPO, run_cli


def test_the_default_composition_is_classification_on_lightning_with_digits(make_cfg):
    cfg = make_cfg()
    assert (cfg.task.name, cfg.pipeline.name, cfg.data.name, cfg.backend.name) == (
        "classification",
        "standard",
        "digits",
        "lightning",
    )
    assert cfg.model._target_.endswith("ResNet")
    assert cfg.tracking.uri.startswith("sqlite:///")


def test_command_line_choices_win_over_the_task_defaults(make_cfg):
    cfg = make_cfg("pipeline=light", "model=resnet18", "data.batch_size=16")
    assert (cfg.pipeline.name, cfg.model.layers, cfg.data.batch_size) == ("light", [2, 2, 2, 2], 16)


def test_backend_keras_composes_with_the_same_task_pipeline_and_data(make_cfg):
    cfg = make_cfg("backend=keras")
    assert (cfg.backend.name, cfg.pipeline.name, cfg.data.name, cfg.backend.devices) == (
        "keras",
        "standard",
        "digits",
        "auto",
    )
    assert cfg.model.keras_target.endswith("keras_model.ResNet")


def test_seed_zero_survives_composition(make_cfg):
    assert make_cfg("seed=0").seed == 0


def test_help_lists_the_groups_and_their_options(tmp_path):
    out = run_cli("--help", cwd=tmp_path)
    assert out.returncode == 0
    for line in (
        "pipeline: light, scale_jitter, small_images, ssd, standard",
        "experiment: cifar10",
        "data: coco, digits, digits_detection, imagefolder",
        "backend: keras, lightning",
        "model: resnet18, resnet50, resnet9, sized_resnet, small_resnet, ssd_resnet50, ssd_small",
        "task: classification, detection",
        "tracking: mlflow, none",
    ):
        assert line in out.stdout
    assert "schema" not in out.stdout.split("== Config groups")[1].split("==")[0]


def test_cfg_job_prints_the_composed_config_and_runs_nothing(tmp_path: Path):
    out = run_cli("--cfg", "job", "optim.lr=0.05", cwd=tmp_path)
    assert out.returncode == 0
    assert "lr: 0.05" in out.stdout and "name: standard" in out.stdout
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "mlflow.db").exists()


def test_cfg_job_resolve_prints_every_value_with_the_run_dir_hydra_would_make(tmp_path: Path):
    out = run_cli("--cfg", "job", "--resolve", "hydra.run.dir=runs/first", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    printed = yaml.safe_load(out.stdout)
    assert printed["paths"] == {
        "root": str(tmp_path),
        "data_dir": str(tmp_path / "data"),
        "output_dir": str(tmp_path / "runs" / "first"),
        "cache_dir": str(tmp_path / ".hydrali_cache"),
    }
    assert not any(tmp_path.iterdir())


def test_the_project_compiles_without_warnings():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-W", "error", "-m", "compileall", "-q", "-f", "core", "backends", "tasks", "conf"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_dali_on_the_cpu_while_the_framework_sees_a_gpu_is_said_in_one_warning(caplog):
    import logging

    from hydrali.core.data.devices import resolve_device

    # this machine has no GPU, so DALI sees none: as on a GPU machine whose DALI package does not match the driver
    with caplog.at_level(logging.WARNING, logger="hydrali.core.data.devices"):
        assert resolve_device("auto", framework_gpus=2, framework="torch") == "cpu"
    (record,) = caplog.records
    assert "torch sees 2 GPU(s) but DALI" in record.getMessage() and "DALI runs on the CPU" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hydrali.core.data.devices"):
        assert resolve_device("auto", framework_gpus=0) == "cpu"
    assert not caplog.records, "a machine without a GPU is not warned about"


@pytest.mark.slow
def test_an_installed_hydrali_is_one_namespace_that_runs_from_anywhere(tmp_path, data_dir):
    import os
    import subprocess
    import sys

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    top = {p.name for p in target.iterdir() if p.name not in ("bin", "__pycache__")}
    assert top == {"hydrali", "hydra_plugins", "hydrali-0.1.0.dist-info"}, top
    # Hydra takes launchers from its hydra_plugins namespace only: hydrali's own there, the namespace left open
    assert {p.name for p in (target / "hydra_plugins").iterdir()} == {"hydrali_launcher"}
    assert (target / "hydrali" / "conf" / "pipeline" / "standard.yaml").is_file(), "the configs ship in the wheel"
    # every module ships (the finder of the venv's editable install would otherwise hide a missing package)
    shipped = {str(p.relative_to(target / "hydrali")) for p in (target / "hydrali").rglob("*.py")}
    source = {str(p.relative_to(REPO)) for top in ("core", "backends", "tasks") for p in (REPO / top).rglob("*.py")}
    assert source <= shipped, f"modules missing from the wheel: {sorted(source - shipped)[:5]}"

    env = {**os.environ, "PYTHONPATH": str(target), "HYDRA_FULL_ERROR": "0"}
    where = subprocess.run(
        [sys.executable, "-c", "import hydrali.core; print(hydrali.core.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(target)), where.stdout
    helped = subprocess.run(
        [sys.executable, "-m", "hydrali.core", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert helped.returncode == 0 and "pipeline: light, scale_jitter, small_images, ssd, standard" in helped.stdout
    trained = subprocess.run(
        [
            sys.executable,
            "-m",
            "hydrali.core",
            "epochs=1",
            "tracking=none",
            f"paths.data_dir={data_dir}",
            f"hydra.run.dir={tmp_path / 'run'}",
            "progress_bar=false",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "run" / "summary.json").is_file()
