"""task.class_weights on an imbalanced image folder: `auto` weighs each class by its inverse frequency, as
scikit-learn's "balanced" weights do, both backends train with them, and weights that do not fit the classes are one
line before anything is written. (The weighted loss is the same on both backends: tests/test_optimizer_semantics.py.)"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from tests.support.checks import fails_with
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY, compose_config

pytestmark = pytest.mark.slow  # its fixture and runs train

TRAIN_IMAGES = {"0": 60, "1": 20, "2": 10}  # an imbalanced training split; val/ keeps every image


@pytest.fixture(scope="module")
def imbalanced(tmp_path_factory, data_dir):
    from hydrali.tasks.classification.datasets import write_digits

    digits = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    root = tmp_path_factory.mktemp("imbalanced")
    for name, count in TRAIN_IMAGES.items():
        (root / "train" / name).mkdir(parents=True)
        for path in sorted((digits / "train" / name).iterdir())[:count]:
            shutil.copy(path, root / "train" / name / path.name)
        shutil.copytree(digits / "val" / name, root / "val" / name)
    return root


def _run(tmp_path, root, backend: str, *extra: str):
    run_dir = tmp_path / backend
    out = run_cli(
        "data=imagefolder",
        f"data.root={root}",
        "epochs=1",
        f"backend={backend}",
        *TINY,
        *(LIGHTNING_QUIET if backend == "lightning" else KERAS_QUIET),
        *extra,
        "tracking=none",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    return out, run_dir


@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_auto_weights_are_the_inverse_class_frequencies_and_train_on_both_backends(tmp_path, imbalanced, backend):
    from sklearn.utils.class_weight import compute_class_weight

    out, _ = _run(tmp_path, imbalanced, backend, "task.class_weights=auto")
    assert out.returncode == 0, out.stderr[-3000:]
    line = re.search(r"class weights \(task.class_weights=auto\): (.*)", out.stderr + out.stdout)
    assert line, out.stderr[-3000:]
    logged = {name: float(weight) for name, weight in (pair.split() for pair in line.group(1).split(", "))}
    labels = np.repeat(list(TRAIN_IMAGES), list(TRAIN_IMAGES.values()))
    balanced = compute_class_weight("balanced", classes=np.array(list(TRAIN_IMAGES)), y=labels)
    assert list(logged) == list(TRAIN_IMAGES)
    np.testing.assert_allclose(list(logged.values()), balanced, rtol=5e-3)  # logged with 3 significant digits


def test_auto_weights_on_a_thousand_to_one_folder_are_bounded_named_and_train_without_collapse(tmp_path, data_dir):
    from hydrali.core.optim.class_weights import MAX_RATIO
    from hydrali.tasks.classification.datasets import write_digits

    digits = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    root = tmp_path / "skewed"
    many, few = sorted((digits / "train" / "0").iterdir()), sorted((digits / "train" / "1").iterdir())[:1]
    for split, folders in (("train", {"0": many * 8, "1": few}), ("val", {"0": None, "1": few})):
        for name, files in folders.items():
            (root / split / name).mkdir(parents=True)
            for i, path in enumerate(files if files is not None else sorted((digits / "val" / name).iterdir())):
                shutil.copy(path, root / split / name / f"{i:05d}.jpg")
    (root / "train" / "0" / "00000.jpg").unlink()  # 1000 train images of class 0 (some repeated), 1 of class 1
    for extra in sorted((root / "train" / "0").iterdir())[1000:]:
        extra.unlink()
    assert len(list((root / "train" / "0").iterdir())) == 1000
    out, run_dir = _run(tmp_path, root, "lightning", "task.class_weights=auto")
    assert out.returncode == 0, out.stderr[-3000:]
    logged = out.stdout + out.stderr
    assert "the weights of 1 (1 image) are capped at 10x the largest class's" in logged, logged[-3000:]
    line = re.search(r"class weights \(task.class_weights=auto\): 0 ([\d.e+-]+), 1 ([\d.e+-]+)", logged)
    weights = [float(w) for w in line.groups()]
    assert weights[1] / weights[0] == pytest.approx(MAX_RATIO, rel=5e-3) and weights[1] < 11
    final = json.loads((run_dir / "summary.json").read_text())["final"]
    assert final["val/loss"] < 5 and final["val/acc"] > 0.5, final  # not collapsed onto the one image's class


@pytest.mark.parametrize(
    "weights, needle",
    [
        ("[1,2]", "task.class_weights has 2 weights for 3 classes (0, 1, 2)"),
        ("[1,0,2]", "every weight must be a positive finite number"),
        ("often", "task.class_weights=often: pass null, auto, or a list of 3 weights"),
    ],
)
def test_class_weights_that_do_not_fit_the_classes_are_one_line_and_write_nothing(
    tmp_path, imbalanced, weights, needle
):
    out, run_dir = _run(tmp_path, imbalanced, "lightning", f"task.class_weights={weights}")
    fails_with(out, needle)
    assert not run_dir.exists()


@pytest.mark.keras
def test_both_sides_of_the_task_take_the_weights_it_resolved(tmp_path, data_dir, imbalanced):
    """What the backends build: the torch side's loss and the Keras side's loss hold the task's weights."""
    from hydra.utils import get_method, instantiate

    cfg = compose_config(
        ["data=imagefolder", f"data.root={imbalanced}", "task.class_weights=[1,2,3]", *TINY], tmp_path, data_dir
    )
    task = instantiate(cfg.task)
    dataset = task.prepare_data(cfg.data, verify="off")
    torch_side = get_method(task.sides["torch"])(task, cfg.model, dataset, 16)
    keras_side = get_method(task.sides["keras"])(task, dataset)
    assert torch_side.class_weights.tolist() == [1.0, 2.0, 3.0]
    assert keras_side.loss().class_weights == [1.0, 2.0, 3.0]
