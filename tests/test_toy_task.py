"""A task added from outside hydrali (issue 51): task=brightness (tests/support/toy_task/), registered by an installed
distribution's entry point (group hydrali.tasks) with a Hydra plugin putting its config options on the search path,
trains one epoch on backend=lightning from the command line, and took at most 12 files, none in core/ or backends/
(docs/adding_a_task.md lists them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checks import read_summary
from tests.support.cli import REPO, run_cli
from tests.support.configs import LIGHTNING_QUIET
from tests.support.toy_task.spec import install

TOY_TASK = REPO / "tests/support/toy_task"
HYDRALI = ("core", "backends", "tasks", "conf")  # hydrali's own folders
NAMES = ("toy_task", "task=brightness", "name: brightness", '"brightness"')  # what would name the task there


def toy_task_files() -> list[Path]:
    """Every file task=brightness needed, relative to the repository (its package, its config options)."""
    return sorted(
        path.relative_to(REPO) for path in TOY_TASK.rglob("*") if path.is_file() and "__pycache__" not in path.parts
    )


@pytest.fixture(scope="module")
def brightness_run(tmp_path_factory) -> Path:
    """One epoch of task=brightness on backend=lightning on the CPU, run as a user runs hydrali; its run dir."""
    root = tmp_path_factory.mktemp("toy")
    env = {**install(root / "site"), "OMP_NUM_THREADS": "1"}
    args = ["task=brightness", "epochs=1", "tracking=none", "backend=lightning", "backend.accelerator=cpu"]
    out = run_cli(
        *args, *LIGHTNING_QUIET, f"paths.data_dir={root / 'data'}", f"hydra.run.dir={root / 'run'}", cwd=root, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "run"


def test_the_toy_task_trains_from_the_command_line_with_its_own_metric(brightness_run):
    summary = read_summary(brightness_run)
    assert summary["task"] == "brightness" and summary["backend"] == "lightning"
    assert summary["monitor"] == "val/error" and [row["epoch"] for row in summary["history"]] == [1]
    assert 0.0 <= summary["best"]["val/error"] <= 1.0
    assert summary["train_images"] == summary["val_images"] == 96 and summary["steps_per_epoch"] == 6
    assert Path(summary["best_checkpoint"]).is_file()


def test_the_toy_task_takes_at_most_12_files_none_in_core_or_backends():
    files = toy_task_files()
    assert len(files) <= 12, files
    assert not [path for path in files if path.parts[0] in ("core", "backends")], files
    assert {"spec.py", "task.py", "recipes.py", "torch_task.py", "brightness.yaml"} <= {path.name for path in files}


def test_no_file_of_hydrali_names_the_toy_task():
    named = [
        path.relative_to(REPO)
        for folder in HYDRALI
        for path in (REPO / folder).rglob("*")
        if path.suffix in (".py", ".yaml") and any(name in path.read_text() for name in NAMES)
    ]
    assert not named, named
