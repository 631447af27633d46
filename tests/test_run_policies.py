"""The run policies that are one key each, decided in core, with one meaning on every backend: keep_checkpoints
(core/policies/retention.py: the newest N per-epoch checkpoints and the best), validate_every (every Nth epoch and the
last: tests/support/checks.py check_validation_every_second_epoch, run on each backend) and progress_bar; the
backends' own keys for these are refused in one line naming the key that does their job."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydrali.core.policies.retention import best_saved_epoch, epochs_to_remove
from hydrali.core.run.runner import run
from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY, compose_config, with_plugin_callback

# val/acc of five epochs: the best is the second, the newest two are 4 and 5
ROWS = [{"epoch": e, "val/acc": acc} for e, acc in zip(range(1, 6), (0.50, 0.90, 0.60, 0.70, 0.80))]


def test_the_newest_n_and_the_best_are_kept_and_zero_keeps_all():
    saved = [1, 2, 3, 4, 5]
    assert epochs_to_remove(saved, ROWS, 2, "val/acc", "max") == [1, 3]  # 2 is the best, 4 and 5 the newest
    assert epochs_to_remove(saved, ROWS, 1, "val/acc", "min") == [2, 3, 4]  # the lowest (epoch 1) is the best
    assert epochs_to_remove(saved, ROWS, 0, "val/acc", "max") == []
    assert epochs_to_remove(saved, ROWS, 9, "val/acc", "max") == []


def test_the_best_kept_is_the_best_of_the_epochs_with_a_file_and_of_those_validated():
    # checkpoint_every=2: epochs 2 and 4 and the last have files; the best of those is 2
    assert best_saved_epoch([2, 4, 5], ROWS, "val/acc", "max") == 2
    assert best_saved_epoch([3, 4, 5], ROWS, "val/acc", "max") == 5  # epoch 2 has no file
    unvalidated = [{"epoch": 1}, {"epoch": 2, "val/acc": 0.4}, {"epoch": 3}]  # validate_every=2 of 3 epochs
    assert best_saved_epoch([1, 2, 3], unvalidated, "val/acc", "max") == 2
    assert epochs_to_remove([1, 2, 3], unvalidated, 1, "val/acc", "max") == [1]
    assert best_saved_epoch([1, 3], unvalidated, "val/acc", "max") is None


def _saved_epochs(folder: Path) -> list[int]:
    return sorted(int(path.name[len("epoch") :].split(".")[0]) for path in folder.glob("epoch*"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])
def test_keep_checkpoints_keeps_the_same_files_on_both_backends(tmp_path, data_dir, backend):
    run_dir = tmp_path / "run"
    quiet = LIGHTNING_QUIET if backend == "lightning" else KERAS_QUIET
    # the lowest val/acc is the best (task.mode=min): an early epoch, as the digits learn
    overrides = [f"backend={backend}", "tracking=none", "seed=0", *TINY, *quiet, "task.mode=min"]
    run(compose_config([*overrides, "epochs=4", "keep_checkpoints=2"], tmp_path, data_dir, run_dir))
    summary = read_summary(run_dir)
    history = [row["val/acc"] for row in summary["history"]]
    best = 1 + history.index(min(history))
    assert best < 3, history  # not one of the newest two: the rule keeps a third file
    assert _saved_epochs(run_dir / "checkpoints") == [best, 3, 4]  # the best, and the newest two
    assert Path(summary["best_checkpoint"]).name.startswith(f"epoch{best:03d}.")


@pytest.mark.parametrize(
    ("backend", "override", "needles"),
    [
        ("lightning", "backend.save_top_k=2", ("backend.save_top_k", "it is now keep_checkpoints")),
        ("lightning", "backend.trainer.check_val_every_n_epoch=2", ("it is now validate_every",)),
        ("lightning", "+backend.trainer.check_val_every_n_epoch=2", ("pass validate_every=2 instead",)),
        ("lightning", "+backend.trainer.enable_progress_bar=false", ("pass progress_bar=false instead",)),
        ("keras", "backend.validation_freq=2", ("backend.validation_freq", "it is now validate_every")),
        ("keras", "backend.verbose=0", ("it is now progress_bar",)),
        ("keras", "backend.keep_checkpoints=1", ("it is now keep_checkpoints",)),
    ],
)
def test_a_backends_own_key_for_a_run_policy_names_the_key_every_backend_takes(tmp_path, backend, override, needles):
    fails_with(run_cli(f"backend={backend}", override, cwd=tmp_path), *needles)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("validate_every=0", "validate_every=0: pass 1 or more"),
        ("keep_checkpoints=-1", "keep_checkpoints=-1: pass 0"),
        ("progress_bar=sometimes", "progress_bar=sometimes: pass auto, true or false"),
    ],
)
def test_a_run_policy_out_of_range_is_refused_in_one_line(tmp_path, data_dir, override, needle):
    from hydrali.core.config.validate import check_config
    from hydrali.core.errors import HydraliError

    with pytest.raises(HydraliError, match=needle):
        check_config(compose_config([override], tmp_path, data_dir))


@pytest.mark.slow
def test_an_epoch_resumed_in_its_middle_validates_where_validate_every_says(tmp_path, data_dir):
    # Lightning runs no on_train_epoch_start for an epoch resumed in its middle: the cadence is set at the start of
    # training too (3 epochs, validate_every=2: the second and the last validate, the last one resumed mid-way)
    from tests.support.plugins import SIGNAL_AT_STEP

    out = tmp_path / "run"
    record = with_plugin_callback("record", "RecordBatches", path=str(tmp_path / "batches.jsonl"))
    args = ["epochs=3", "validate_every=2", *TINY, *LIGHTNING_QUIET, "tracking=none", f"paths.data_dir={data_dir}"]
    args += [record, f"hydra.run.dir={out}"]
    steps = 22  # the digits' training split at TINY's batch
    stopped = run_cli(*args, cwd=tmp_path, env={SIGNAL_AT_STEP: str(2 * steps + steps // 2)})  # in the third epoch
    assert stopped.returncode == 128 + 10, stopped.stderr[-3000:]  # 128 + SIGUSR1: saved mid-epoch, stopped
    resumed = run_cli(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    validated = [any(key.startswith("val/") for key in row) for row in read_summary(out)["history"]]
    assert validated == [False, True, True]


def test_a_run_recorded_with_a_backends_own_policy_key_is_composed_again_without_it(caplog):
    # run.json of a run trained before the key moved to core holds its override: composed again (a resume, hydrali
    # eval), it is left out with a warning naming the key that does its job, not refused
    from hydrali.core.run.run_dir import merge_overrides, not_compared

    recorded = ["epochs=3", "backend.trainer.enable_progress_bar=false", "backend.validation_freq=2", "optim.lr=0.1"]
    with caplog.at_level("WARNING", logger="hydrali"):
        merged = merge_overrides(recorded, ["optim.lr=0.2"])
    assert merged == ["epochs=3", "optim.lr=0.2"]
    assert "progress_bar does its job now" in caplog.text and "validate_every does its job now" in caplog.text
    # nor do the old keys and the run policies make an attempt's config "another" run's
    assert {"backend.save_top_k", "backend.verbose", "keep_checkpoints", "validate_every"} <= set(not_compared())


@pytest.mark.slow
def test_a_lightning_run_resumed_from_an_earlier_checkpoint_drops_the_later_files(tmp_path, data_dir):
    run_dir = tmp_path / "run"
    overrides = ["backend=lightning", "tracking=none", "seed=0", *TINY, *LIGHTNING_QUIET, "keep_checkpoints=0"]
    run(compose_config([*overrides, "epochs=3"], tmp_path, data_dir, run_dir))
    folder = run_dir / "checkpoints"
    assert _saved_epochs(folder) == [1, 2, 3]
    earlier = folder / "epoch001.ckpt"
    run(compose_config([*overrides, "epochs=3", f"ckpt_path={earlier}"], tmp_path, data_dir, run_dir))
    # epochs 2 and 3 trained again: their files are the new run's (no stale epoch003.ckpt beside an epoch003-v1)
    assert sorted(path.name for path in folder.glob("epoch*")) == ["epoch001.ckpt", "epoch002.ckpt", "epoch003.ckpt"]
    assert read_summary(run_dir)["history"][-1]["epoch"] == 3
