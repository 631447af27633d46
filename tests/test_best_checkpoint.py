"""A run whose best epoch was not checkpointed (checkpoint_every above 1): summary.json names the epoch its best
checkpoint holds beside the best epoch, the end-of-run table says so, and `hydrali eval RUN` says which epoch it
scores and why, on both backends. Observed from outside: the epoch each checkpoint file holds as the backend reads it
back, and the commands' own output."""

from __future__ import annotations

import pytest

from tests.support.checks import read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY

pytestmark = pytest.mark.slow
# The worst validation loss is the first epoch's (a small, steady lr): monitoring val/loss with mode=max makes
# epoch 1 the best, and checkpoint_every=2 keeps a checkpoint after epoch 2 only.
BEST_FIRST = ["epochs=2", "checkpoint_every=2", "task.monitor=val/loss", "task.mode=max", "optim.lr=0.02"]
QUIET = {"lightning": LIGHTNING_QUIET, "keras": KERAS_QUIET}


@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])
def test_a_best_epoch_not_checkpointed_is_named_beside_the_checkpoint_that_eval_scores(tmp_path, data_dir, backend):
    from hydrali.core.contracts.registry import load_backend

    run = tmp_path / "run"
    args = [f"backend={backend}", *BEST_FIRST, "optim.warmup_epochs=0", *TINY, *QUIET[backend], "tracking=none"]
    trained = run_cli(*args, f"paths.data_dir={data_dir}", f"hydra.run.dir={run}", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = read_summary(run)
    checkpoint = run / "checkpoints" / summary["best_checkpoint"].rsplit("/", 1)[-1]
    held = load_backend(backend).checkpoint_epochs(checkpoint)
    assert (summary["best_epoch"], held, summary["best_checkpoint_epoch"]) == (1, 2, 2)
    assert "epoch 2: epoch 1, the best, was not checkpointed" in trained.stdout
    scored = run_cli("eval", str(run), f"paths.data_dir={data_dir}", cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert f"ckpt=best takes {checkpoint.name}, epoch 2: the run's best epoch, 1, was not checkpointed" in scored.stdout
