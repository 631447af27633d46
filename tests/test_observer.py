"""core's TrainingObserver, the one vocabulary both backends' callbacks speak: what an epoch's row holds and what a
FitResult takes, driven here as a framework's hooks would drive it."""

from __future__ import annotations

import json

from tests.support.observers import untracked_observer


def _observer(tmp_path, steps_per_epoch=4, images_per_batch=16):
    return untracked_observer(tmp_path, steps_per_epoch=steps_per_epoch, images_per_batch=images_per_batch)


def _epoch(observer, epoch, lrs, metrics, validated):
    observer.epoch_start(epoch)
    for step, lr in enumerate(lrs):
        observer.step_start(step, lambda lr=lr: lr)
        observer.step_end()
    if validated:
        observer.validation_start()
    observer.epoch_end(epoch, metrics, validated)


def test_an_epochs_row_holds_its_images_lrs_and_val_metrics_only_when_it_validated(tmp_path):
    observer = _observer(tmp_path)
    _epoch(observer, 0, [0.1, 0.2, 0.3, 0.4], {"train/loss": 2.0, "val/acc": 0.5, "other": 1.0}, validated=True)
    _epoch(observer, 1, [0.5, 0.6, 0.7, 0.8], {"train/loss": 1.0, "val/acc": 0.5}, validated=False)
    rows = json.loads((tmp_path / "history.json").read_text())["history"]  # what the run dir keeps
    first, second = rows[0], rows[1]
    assert (first["epoch"], second["epoch"]) == (1, 2), "the record counts epochs from 1"
    assert (first["train/images"], first["lr/first"], first["lr/last"], first["val/acc"]) == (64, 0.1, 0.4, 0.5)
    assert "other" not in first
    assert "val/acc" not in second and (second["lr/first"], second["lr/last"]) == (0.5, 0.8)
    fields = observer.fit_fields(start_epoch=0)
    assert (fields["first_epoch"], fields["epochs_completed"]) == (0, 2)
    assert fields["train_seconds"] > 0 and fields["first_step_seconds"] is not None


def test_the_lr_is_read_at_the_first_and_last_step_only(tmp_path):
    observer = _observer(tmp_path, steps_per_epoch=5)
    reads = []
    observer.epoch_start(0)
    for step in range(5):
        observer.step_start(step, lambda step=step: reads.append(step) or 0.01 * step)
        observer.step_end()
    assert reads == [0, 4]


def test_an_epoch_ended_before_a_resume_is_not_recorded_again(tmp_path):
    """Lightning may end, after a resume, the epoch a checkpoint was taken in: without its start, no row."""
    observer = _observer(tmp_path)
    observer.epoch_end(2, {"train/loss": 1.0}, validated=False)
    assert observer.record.rows == []
    assert observer.fit_fields(start_epoch=2)["epochs_completed"] == 2


def test_an_epoch_the_framework_ends_early_still_has_its_last_steps_lr(tmp_path):
    """Lightning's limit_train_batches (or fast_dev_run) runs fewer steps than the plan's: lr/last is the lr of the
    epoch's last step all the same."""
    observer = _observer(tmp_path, steps_per_epoch=10)
    observer.epoch_start(0)
    for step, lr in enumerate([0.1, 0.2, 0.3]):
        observer.step_start(step, lambda lr=lr: lr, steps_in_epoch=3)
        observer.step_end()
    observer.epoch_end(0, {"train/loss": 1.0}, validated=False)
    row = observer.record.rows[0]
    assert (row["lr/first"], row["lr/last"], row["train/images"]) == (0.1, 0.3, 48)
