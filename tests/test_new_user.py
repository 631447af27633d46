"""What a new user meets (issue 50): each mistake ends in one line naming the fix, exit code 2, and nothing written:
no run or sweep dir, no MLflow store."""

from __future__ import annotations

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
