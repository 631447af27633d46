"""What a new user meets (issue 50): each mistake ends in one line naming the fix, exit code 2, and nothing written:
no run or sweep dir, no MLflow store."""

from __future__ import annotations

import shutil

import pytest

from tests.support.checks import fails_with
from tests.support.cli import run_cli


def _nothing_written(root) -> None:
    left = sorted(path.name for path in root.iterdir())
    assert not {"outputs", "multirun", "mlflow.db", "mlartifacts"} & set(left), left


@pytest.mark.parametrize(
    ("sweep", "needle"),
    [
        ("optim.lrr=0.1,0.2", "optim.lrr is not a setting of optim: did you mean optim.lr?"),
        ("backend=lightning,kears", "backend=kears is not an option of backend: choose one of keras, lightning"),
        ("epochs=abc,1", "epochs=abc: Value 'abc' of type 'str' could not be converted to Integer"),
        ("optim.lr=0.1,-1", "optim.lr=-1.0: the learning rate must be above 0"),  # a value check, not composition
    ],
)
def test_a_typo_inside_a_sweep_is_one_line_before_the_sweep_starts(tmp_path, sweep, needle):
    out = run_cli("-m", sweep, cwd=tmp_path, env={"HYDRALI_ROOT": str(tmp_path)}, timeout=120)
    fails_with(out, needle)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    _nothing_written(tmp_path)


@pytest.fixture
def one_class(tmp_path, data_dir):
    """A folder dataset whose train/ and val/ hold one class (the digits' 3s)."""
    from hydrali.tasks.classification.datasets import write_digits

    digits = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    root = tmp_path / "one_class"
    for split in ("train", "val"):
        shutil.copytree(digits / split / "3", root / split / "three")
    return root


@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_a_folder_of_one_class_is_refused_before_anything_is_written(tmp_path, one_class, backend):
    # before: Lightning failed after 9.6 s in torchmetrics' words; Keras exited 0 with val/acc 1
    root = tmp_path / "root"
    root.mkdir()
    out = run_cli(
        "data=imagefolder", f"data.root={one_class}", f"backend={backend}", cwd=root, env={"HYDRALI_ROOT": str(root)}
    )
    fails_with(out, f"{one_class}/train (class folders) has 1 class(es)", "needs at least 2")
    _nothing_written(root)


@pytest.mark.parametrize(
    ("count", "needle"),
    [
        ("data.batch_size=0", "data.batch_size=0: it must be at least 1"),
        ("epochs=0", "epochs=0: it must be at least 1"),
        ("optim.warmup_epochs=-1", "optim.warmup_epochs=-1.0: it cannot be negative"),
        ("optim.ref_batch=0", "optim.ref_batch=0: it must be a positive batch size"),
        ("data.global_batch=0", "data.global_batch=0: pass at least 1"),
    ],
)
def test_a_count_is_checked_before_the_data(tmp_path, count, needle):
    """A wrong count is named first, where the data is wrong as well (before, the data check came first and named
    the missing folder, 4-6 s later)."""
    missing = tmp_path / "no_such_folder"
    out = run_cli("data=imagefolder", f"data.root={missing}", count, cwd=tmp_path, env={"HYDRALI_ROOT": str(tmp_path)})
    fails_with(out, needle)
    _nothing_written(tmp_path)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["task=detection", "model=resnet18"],
            "model=resnet18 is a classification network and cannot be trained by "
            "task=detection: choose model= one of ssd_resnet50, ssd_small",
        ),
        (
            ["model=ssd_small"],
            "model=ssd_small is a detection network and cannot be trained by task=classification: "
            "choose model= one of resnet18, resnet50, resnet9, sized_resnet, small_resnet, timm",
        ),
        (["model=ssd_small", "backend=keras"], "model=ssd_small is a detection network"),
        (["-m", "model=small_resnet,ssd_small"], "model=ssd_small is a detection network"),  # checked in every job
    ],
)
def test_a_model_of_the_other_task_is_refused_naming_the_tasks_models(tmp_path, args, needle):
    # before: 5-7 s, then `'strides'`, `SSD.__init__() missing ... 'image_size'` or a ResNet keyword error, a run dir
    # and a FAILED MLflow run left
    out = run_cli(*args, cwd=tmp_path, env={"HYDRALI_ROOT": str(tmp_path)})
    fails_with(out, needle)
    _nothing_written(tmp_path)
