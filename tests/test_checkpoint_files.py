"""The checkpoint files a run leaves. Lightning (backends/lightning/checkpoints.py): epochNNN.ckpt after each epoch
that saves and last.ckpt a second name of the newest (written once: a hard link), which a resume continues from, or
the newest epoch's file where a stop came before last.ckpt named it. Both backends: with checkpoint_every=N the
epochs that save are the same (every Nth and the last), the best checkpoint is the best of those, and a resume
continues from the newest."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hydrali.core.run.runner import run
from tests.support.checks import read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY, compose_config


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
    # keep_checkpoints=1: the newest (epoch 2, last.ckpt a second name of it) and the best (epoch 1)
    assert sorted(p.name for p in folder.glob("*.ckpt")) == ["epoch001.ckpt", "epoch002.ckpt", "last.ckpt"]
    assert (folder / "last.ckpt").samefile(folder / "epoch002.ckpt")
    assert (_epochs_in(folder / "epoch001.ckpt"), _epochs_in(folder / "last.ckpt")) == (1, 2)
    assert Path(summary["best_checkpoint"]).name == "epoch001.ckpt"


@pytest.mark.slow
def test_a_stop_between_an_epochs_file_and_last_ckpt_resumes_from_that_epochs_file(tmp_path, data_dir):
    """A run stopped after epoch N's file was written and before last.ckpt named it (Ctrl+C or SIGTERM in that
    moment: last.ckpt missing, or still naming epoch N-1) resumes from epoch N's file, which it does not train
    again (the file is the same inode afterwards); one stopped while epoch N's file was written (cut short) resumes
    from last.ckpt, epoch N-1's."""
    run_dir = tmp_path / "run"
    overrides = ["tracking=none", "seed=0", *TINY, *LIGHTNING_QUIET, "keep_checkpoints=0"]
    run(compose_config([*overrides, "epochs=2"], tmp_path, data_dir, run_dir))
    folder = run_dir / "checkpoints"
    (folder / "last.ckpt").unlink()  # stopped before last.ckpt was linked to epoch002.ckpt
    second = (folder / "epoch002.ckpt").stat().st_ino
    run(compose_config([*overrides, "epochs=3", "ckpt_path=last"], tmp_path, data_dir, run_dir))
    assert [row["epoch"] for row in read_summary(run_dir)["history"]] == [1, 2, 3]
    assert (folder / "epoch002.ckpt").stat().st_ino == second, "epoch 2 was trained again"

    (folder / "last.ckpt").unlink()  # stopped before last.ckpt, naming epoch 2's file, was moved to epoch 3's
    (folder / "last.ckpt").hardlink_to(folder / "epoch002.ckpt")
    third = (folder / "epoch003.ckpt").stat().st_ino
    run(compose_config([*overrides, "epochs=4", "ckpt_path=last"], tmp_path, data_dir, run_dir))
    history = read_summary(run_dir)["history"]
    assert [row["epoch"] for row in history] == [1, 2, 3, 4]
    assert (folder / "epoch003.ckpt").stat().st_ino == third, "epoch 3 was trained again"
    assert (folder / "last.ckpt").samefile(folder / "epoch004.ckpt")

    # stopped while epoch 5's file was copied in from the temporary folder (another file system): cut short
    whole = (folder / "epoch004.ckpt").read_bytes()
    (folder / "epoch005.ckpt").write_bytes(whole[: len(whole) // 2])
    run(compose_config([*overrides, "epochs=5", "ckpt_path=last"], tmp_path, data_dir, run_dir))
    assert [row["epoch"] for row in read_summary(run_dir)["history"]] == [1, 2, 3, 4, 5]
    assert (folder / "last.ckpt").samefile(folder / "epoch005.ckpt")
    assert torch.load(folder / "epoch005.ckpt", map_location="cpu", weights_only=False)["epoch"] == 4  # whole now


@pytest.mark.slow
@pytest.mark.keras
def test_a_keras_run_stopped_while_writing_a_checkpoint_resumes_from_the_epoch_before(tmp_path, data_dir, monkeypatch):
    """Ctrl+C arriving while Keras writes epoch 2's weights (the KeyboardInterrupt raised between two of h5py's
    writes, where Python delivers it): no damaged epoch002 file is left for a resume to stop at; the same run
    resumed continues from epoch 1's file and trains epoch 2."""
    import h5py

    write = h5py.Group.create_dataset

    def stopped_in_epoch_2s_file(group, *args, **kwargs):
        if "epoch002" in group.file.filename and len(group.file.keys()) > 1:  # a few writes into the file
            raise KeyboardInterrupt
        return write(group, *args, **kwargs)

    run_dir = tmp_path / "run"
    overrides = ["backend=keras", "tracking=none", "seed=0", *TINY, *KERAS_QUIET, "keep_checkpoints=0", "epochs=2"]
    monkeypatch.setattr(h5py.Group, "create_dataset", stopped_in_epoch_2s_file)
    with pytest.raises(KeyboardInterrupt):
        run(compose_config(overrides, tmp_path, data_dir, run_dir))
    monkeypatch.undo()
    folder = run_dir / "checkpoints"
    assert (folder / "epoch001.weights.h5").is_file()
    assert not (folder / "epoch002.weights.h5").exists(), "a damaged epoch 2 file"

    run(compose_config([*overrides, "ckpt_path=last"], tmp_path, data_dir, run_dir))
    summary = read_summary(run_dir)
    assert [row["epoch"] for row in summary["history"]] == [1, 2] and summary["first_epoch"] == 2
    assert sorted(p.name for p in folder.iterdir() if p.name.endswith(".h5")) == [
        "epoch001.weights.h5",
        "epoch002.weights.h5",
    ], "no half-written file left"


def _saved_epochs(folder) -> list[int]:
    """The epochs whose checkpoint file is in `folder`, on either backend (epochNNN.ckpt, epochNNN.weights.h5)."""
    return sorted(_epoch_of(path) for path in folder.glob("epoch*"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])  # in this process:
# what is checked is the files a run writes, not the command line
def test_checkpoint_every_saves_the_same_epochs_on_both_backends_and_the_best_is_the_best_of_those(
    tmp_path, data_dir, backend
):
    quiet, keep_all = (LIGHTNING_QUIET if backend == "lightning" else KERAS_QUIET), "keep_checkpoints=0"
    run_dir = tmp_path / "run"
    # the lowest val/acc is the best (task.mode=min): an early epoch, as the digits learn, which saves no checkpoint
    overrides = [f"backend={backend}", "tracking=none", "seed=0", *TINY, *quiet, keep_all, "task.mode=min"]
    run(compose_config([*overrides, "epochs=5", "checkpoint_every=3"], tmp_path, data_dir, run_dir))
    summary = read_summary(run_dir)
    history = [row["val/acc"] for row in summary["history"]]
    folder = run_dir / "checkpoints"
    assert _saved_epochs(folder) == [3, 5]  # every third epoch and the last
    assert summary["best_epoch"] not in (3, 5), history  # the record's best epoch (its metrics) has no file
    assert _epoch_of(summary["best_checkpoint"]) == min((3, 5), key=lambda epoch: history[epoch - 1])

    run(compose_config([*overrides, "epochs=6", "checkpoint_every=3", "ckpt_path=last"], tmp_path, data_dir, run_dir))
    resumed = read_summary(run_dir)
    assert [row["epoch"] for row in resumed["history"]] == [1, 2, 3, 4, 5, 6]
    assert resumed["history"][:5] == summary["history"]  # continued from the newest (epoch 5), not trained again
    assert _saved_epochs(folder) == [3, 5, 6]


def _epoch_of(path: str) -> int:
    """The epoch a checkpoint file's name gives."""
    return int(Path(path).name[len("epoch") :].split(".")[0])


def test_checkpoint_every_below_one_is_refused_in_one_line(tmp_path, data_dir):
    from hydrali.core.config.validate import check_config
    from hydrali.core.errors import HydraliError

    with pytest.raises(HydraliError, match=r"checkpoint_every=0: pass 1 or more"):
        check_config(compose_config(["checkpoint_every=0"], tmp_path, data_dir))
