"""Composition: the task picks its defaults, the command line wins, --help and --cfg work."""
from pathlib import Path

from tests.conftest import run_cli


def test_the_default_composition_is_classification_on_lightning_with_digits(make_cfg):
    cfg = make_cfg()
    assert (cfg.task.name, cfg.pipeline.name, cfg.data.name, cfg.backend.name) == (
        "classification", "standard", "digits", "lightning")
    assert cfg.model._target_.endswith("ResNet")
    assert cfg.tracking.uri.startswith("sqlite:///")


def test_command_line_choices_win_over_the_task_defaults(make_cfg):
    cfg = make_cfg("pipeline=light", "model=resnet18", "data.batch_size=16")
    assert (cfg.pipeline.name, cfg.model.layers, cfg.data.batch_size) == ("light", [2, 2, 2, 2], 16)


def test_backend_keras_composes_with_the_same_task_pipeline_and_data(make_cfg):
    cfg = make_cfg("backend=keras")
    assert (cfg.backend.name, cfg.pipeline.name, cfg.data.name, cfg.backend.replicas) == (
        "keras", "standard", "digits", None)
    assert cfg.model.keras_target.endswith("keras_model.ResNet")


def test_seed_zero_survives_composition(make_cfg):
    assert make_cfg("seed=0").seed == 0


def test_help_lists_the_groups_and_their_options(tmp_path):
    out = run_cli("--help", cwd=tmp_path)
    assert out.returncode == 0
    for line in ("pipeline: light, standard", "data: digits, imagefolder", "backend: keras, lightning",
                 "model: resnet18, resnet50, small_resnet", "tracking: mlflow, none"):
        assert line in out.stdout
    assert "schema" not in out.stdout.split("== Config groups")[1].split("==")[0]


def test_cfg_job_prints_the_composed_config_and_runs_nothing(tmp_path: Path):
    out = run_cli("--cfg", "job", "optim.lr=0.05", cwd=tmp_path)
    assert out.returncode == 0
    assert "lr: 0.05" in out.stdout and "name: standard" in out.stdout
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "mlflow.db").exists()
