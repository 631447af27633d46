"""A model name that its library does not know is one line before anything is written: timm's registry on torch (with
the closest names), keras-hub's converters of timm's networks on Keras."""

from __future__ import annotations

import pytest

from tests.support.checks import fails_with
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "backend, needle",
    [
        ("lightning", "model.name=resnet5O is not a network of timm's registry: did you mean resnet50"),
        ("keras", "model.name=resnet5O on Keras: Currently, the architecture resnet5O is not supported"),
    ],
)
def test_a_mistyped_timm_model_is_one_line_and_writes_nothing(tmp_path, data_dir, backend, needle):
    args = ["model=timm", "model.name=resnet5O", f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / 'run'}"]
    fails_with(run_cli(f"backend={backend}", *args, cwd=tmp_path), needle)
    assert list(tmp_path.iterdir()) == [], "no run dir, no MLflow store"
