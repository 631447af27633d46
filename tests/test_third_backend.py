"""A third backend, registered from outside hydrali (tests/support/plain_torch_spec.py: an installed distribution's
entry point) and written as a plain PyTorch loop through the run contract and the shared torch package
(tests/support/plain_torch_backend.py), trains classification as Lightning does: the same epoch record and the same
weights, to 1e-5 on the CPU with deterministic=true (issue 34)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import LIGHTNING_QUIET, TINY
from tests.support.plain_torch_spec import install

SAME = ["epochs=1", "deterministic=true", "tracking=none", *TINY]
# one compute thread in both runs: on 2 busy cores torch's OpenMP pool of 2 threads made an epoch 3x slower
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
TOLERANCE = 1e-5  # absolute, on losses, accuracy and every weight
RECORDED = ("train/loss", "val/loss", "val/acc", "train/images", "val/images", "lr/first", "lr/last")


@pytest.fixture(scope="module")
def plain_env(tmp_path_factory) -> dict[str, str]:
    """The environment of a Python with backend=plain installed (as FAKE_MODULE was, through an entry point)."""
    return {**install(tmp_path_factory.mktemp("site")), **ONE_THREAD}


@pytest.fixture(scope="module")
def both(tmp_path_factory, data_dir, plain_env) -> Path:
    """One epoch of the same run on backend=lightning (on the CPU) and on backend=plain, in <dir>/<backend>."""
    root = tmp_path_factory.mktemp("third")
    runs = {
        "lightning": (["backend=lightning", "backend.accelerator=cpu", *LIGHTNING_QUIET], ONE_THREAD),
        "plain": (["backend=plain"], plain_env),
    }
    for name, (args, env) in runs.items():
        out = run_cli(f"paths.data_dir={data_dir}", f"hydra.run.dir={root / name}", *SAME, *args, cwd=root, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
    return root


def test_the_plain_backend_records_the_epochs_lightning_records(both):
    lightning, plain = (read_summary(both / name) for name in ("lightning", "plain"))
    assert plain["backend"] == "plain" and plain["steps_per_epoch"] == lightning["steps_per_epoch"] > 1
    assert [row["epoch"] for row in plain["history"]] == [row["epoch"] for row in lightning["history"]] == [1]
    for ours, theirs in zip(plain["history"], lightning["history"], strict=True):
        for key in RECORDED:
            assert ours[key] == pytest.approx(theirs[key], abs=TOLERANCE, rel=0), key
    assert plain["best_epoch"] == lightning["best_epoch"]
    assert Path(plain["best_checkpoint"]).name == "last.pt"


def test_the_plain_backend_trains_the_weights_lightning_trains(both):
    import torch

    lightning = torch.load(both / "lightning/checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    plain = torch.load(both / "plain/checkpoints/last.pt", map_location="cpu", weights_only=True)
    theirs, ours = lightning["state_dict"], plain["state_dict"]
    assert sorted(ours) == sorted(theirs) and all(key.startswith("torch_task.") for key in ours)
    # Lightning took every step: weights equal to its trained ones are trained ones
    assert lightning["global_step"] == read_summary(both / "plain")["steps_per_epoch"] > 1
    for key, weight in theirs.items():
        torch.testing.assert_close(ours[key], weight, atol=TOLERANCE, rtol=0, msg=key)


def test_hydrali_eval_scores_a_plain_run_as_training_did(both, plain_env):
    """`hydrali eval` loads the plain run's last.pt through the shared torch package (load_trained)."""
    out = run_cli("eval", str(both / "plain"), cwd=both, env=plain_env)
    assert out.returncode == 0, out.stderr[-3000:]
    scored = json.loads((both / "plain/eval/val/metrics.json").read_text())
    trained = read_summary(both / "plain")["final"]["val/acc"]
    assert scored["metrics"]["val/acc"] == pytest.approx(trained, abs=1e-6)


@pytest.mark.parametrize(
    "setting, capability",
    [("progressive_resizing.start_side=8", "progressive_resizing"), ("model.weights={run}", "start_from_run")],
)
def test_what_the_plain_backend_does_not_support_is_refused_before_anything_is_written(
    both, plain_env, tmp_path, setting, capability
):
    """backend=plain's spec does not declare progressive resizing or a start from another run: asked for either, the
    run is one line naming the setting and the backends that honour it, and writes nothing (it was ignored before)."""
    setting = setting.format(run=both / "lightning")
    out = run_cli("backend=plain", setting, *TINY, cwd=tmp_path, env=plain_env)
    fails_with(
        out, f"{setting}: backend=plain does not support {capability}", "choose backend= one of keras, lightning"
    )
    assert not list(tmp_path.iterdir()), "a refused run writes nothing"
