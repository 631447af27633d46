"""What a run recorded (its summary.json), a refusal's one line, and the checks that the Lightning and the Keras
tests both make of a run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.configs import SMALL_NET, TINY


def read_summary(output_dir: Path) -> dict:
    """The summary.json a run wrote."""
    return json.loads((Path(output_dir) / "summary.json").read_text())


def fails_with(out: subprocess.CompletedProcess, *needles: str) -> None:
    """The run ended with exit code 2 and one line `hydrali: error: ...` holding every needle; no traceback."""
    assert out.returncode == 2, f"rc {out.returncode}: {out.stderr[-3000:]}"
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("hydrali: error:")]
    assert len(errors) == 1, out.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]


# The worst validation loss is the first epoch's (a small, steady lr): monitoring val/loss with
# mode=max makes the best epoch fall before an interruption at epoch 2, as a user's best often does.
RESUME_ARGS = ["epochs=3", "task.monitor=val/loss", "task.mode=max", "optim.lr=0.02", "optim.warmup_epochs=0", *TINY]


def check_resume_keeps_the_record(make_cfg, tmp_path: Path, args: list[str], interrupt: str) -> dict:
    """Run 3 epochs whole; run them again interrupted (Ctrl+C, by the callback `interrupt`) at epoch 2 and resumed
    with ckpt_path=last; check that the resumed run's record, best value and best checkpoint are the uninterrupted
    run's. Returns its summary."""
    from mlflow.tracking import MlflowClient

    from hydrali.core.run.runner import run

    whole_dir, resumed_dir = tmp_path / "whole", tmp_path / "resumed"
    whole_value = run(make_cfg(*RESUME_ARGS, *args, output_dir=whole_dir))
    whole = read_summary(whole_dir)
    assert whole["best_epoch"] == 1, "the test needs the best epoch before the interruption"

    stop = f"+backend.callbacks.interrupt={{_target_: {interrupt}, epoch: 2}}"
    with pytest.raises(KeyboardInterrupt):
        run(make_cfg(*RESUME_ARGS, *args, stop, output_dir=resumed_dir))
    assert not (resumed_dir / "summary.json").exists()
    # data.verify changes on resume: a changed param is logged under resume1/, not dropped
    value = run(make_cfg(*RESUME_ARGS, *args, "ckpt_path=last", "data.verify=off", output_dir=resumed_dir))
    resumed = read_summary(resumed_dir)

    assert (resumed["first_epoch"], resumed["epochs"]) == (3, 3)
    assert [row["epoch"] for row in resumed["history"]] == [1, 2, 3]
    assert resumed["history"][:2] == whole["history"][:2], "the epochs before the interruption are kept as they were"
    assert resumed["best"] == whole["best"] and resumed["best_epoch"] == 1
    assert value == whole_value == whole["best"]["val/loss"], "the sweeper gets the best of the whole run"
    assert Path(resumed["best_checkpoint"]).is_file(), "the best checkpoint survives the interruption"
    assert resumed["train_images"] == whole["train_images"]
    client = MlflowClient(make_cfg().tracking.uri)
    run_ = client.get_run(resumed["mlflow_run_id"])
    assert [m.step for m in client.get_metric_history(run_.info.run_id, "val/loss")] == [1, 2, 3]
    assert (run_.data.params["data.verify"], run_.data.params["resume1/data.verify"]) == ("quick", "off")
    return resumed


def check_validation_every_second_epoch(make_cfg, tmp_path: Path, args: list[str]) -> None:
    """3 epochs validating every second one (`args` set validate_every=2): epoch 2 validates, and epoch 3 as the
    last; epoch 1 has no val metrics anywhere."""
    from mlflow.tracking import MlflowClient

    from hydrali.core.run.runner import run

    out = tmp_path / "every2"
    run(make_cfg("epochs=3", *SMALL_NET, *args, output_dir=out))
    summary = read_summary(out)
    val_keys = [sorted(k for k in row if k.startswith("val/")) for row in summary["history"]]
    assert val_keys[0] == [] and "val/acc" in val_keys[1] and "val/acc" in val_keys[2]
    assert "val/acc" in summary["final"], "the last epoch validates"
    assert summary["best_epoch"] in (2, 3) and summary["val_images"] == 360
    client = MlflowClient(make_cfg().tracking.uri)
    assert [m.step for m in client.get_metric_history(summary["mlflow_run_id"], "val/acc")] == [2, 3]


def check_each_val_image_counted_once(summary: dict, val_set: int = 360) -> None:
    """Every validation scored the whole set once: the count, and an accuracy that is k / val_set."""
    assert summary["val_images"] == val_set
    for row in summary["history"]:
        assert row["val/images"] == val_set
        assert abs(row["val/acc"] * val_set - round(row["val/acc"] * val_set)) < 1e-3, row
