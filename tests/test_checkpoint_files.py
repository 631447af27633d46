"""The checkpoint files a Lightning run leaves (backends/lightning/callbacks.py LastCheckpoint): last.ckpt after every
epoch, the best by task.monitor, and when the epoch just trained is the best, one file under both names (written
once: a hard link) that a resume continues from and that outlives the best file's replacement."""

from __future__ import annotations

import pytest
import torch

from tests.support.checks import read_summary
from tests.support.cli import run_cli
from tests.support.configs import LIGHTNING_QUIET, TINY


def _train(tmp_path, run_dir, *overrides: str) -> dict:
    out = run_cli(
        *TINY, *LIGHTNING_QUIET, "tracking=none", "seed=0", f"hydra.run.dir={run_dir}", *overrides, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return read_summary(run_dir)


def _epochs_in(path) -> int:
    """The whole epochs a Lightning checkpoint holds (Lightning counts the epoch in progress from 0)."""
    return torch.load(path, map_location="cpu", weights_only=False)["epoch"] + 1


@pytest.mark.slow
def test_the_best_epochs_checkpoint_is_last_ckpt_written_once_and_a_resume_continues_from_it(tmp_path):
    run_dir = tmp_path / "run"
    summary = _train(tmp_path, run_dir, "epochs=2")
    history = [row["val/acc"] for row in summary["history"]]
    assert history[1] > history[0], history  # the digits learn: the second epoch is the best
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.glob("*.ckpt")) == ["epoch002.ckpt", "last.ckpt"]
    assert (folder / "last.ckpt").samefile(folder / "epoch002.ckpt")
    assert _epochs_in(folder / "last.ckpt") == 2

    resumed = _train(tmp_path, run_dir, "epochs=3", "ckpt_path=last")
    assert [row["epoch"] for row in resumed["history"]] == [1, 2, 3]
    assert resumed["history"][:2] == summary["history"][:2]
    if resumed["history"][2]["val/acc"] > history[1]:  # epoch002.ckpt replaced by epoch003.ckpt, last.ckpt with it
        assert sorted(p.name for p in folder.glob("*.ckpt")) == ["epoch003.ckpt", "last.ckpt"]
        assert (folder / "last.ckpt").samefile(folder / "epoch003.ckpt")
    assert _epochs_in(folder / "last.ckpt") == 3


@pytest.mark.slow
def test_after_an_epoch_that_is_not_the_best_last_ckpt_is_its_own_file_of_that_epoch(tmp_path):
    run_dir = tmp_path / "run"
    # the lowest val/acc is the best: the first epoch, as the digits learn
    summary = _train(tmp_path, run_dir, "epochs=2", "task.mode=min")
    history = [row["val/acc"] for row in summary["history"]]
    assert history[1] > history[0], history
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.glob("*.ckpt")) == ["epoch001.ckpt", "last.ckpt"]
    assert not (folder / "last.ckpt").samefile(folder / "epoch001.ckpt")
    assert (_epochs_in(folder / "epoch001.ckpt"), _epochs_in(folder / "last.ckpt")) == (1, 2)
