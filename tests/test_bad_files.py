"""data.bad_files=skip: a set with a truncated JPEG and a GIF named .jpg trains without them, on both tasks; the run
dir lists exactly those files, and the epoch steps counts the images left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from hydrali.core.run import runner
from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY, compose_config
from tests.support.datasets import write_rectangles_coco

pytestmark = pytest.mark.slow


def _truncate(path: Path) -> None:
    """Cut a JPEG file in half, as an interrupted download leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _as_gif(path: Path) -> None:
    """Write the image again as a GIF under its .jpg name (a format DALI does not decode)."""
    with Image.open(path) as img:
        img.convert("P").save(path, format="GIF")


def _listed(run_dir: Path) -> set[str]:
    """The files named by the run dir's skipped_files.txt."""
    lines = (run_dir / "skipped_files.txt").read_text().splitlines()
    return {line.split("\t")[0] for line in lines}


def test_an_image_folder_with_a_truncated_jpeg_and_a_gif_trains_without_them(tmp_path, digits_copy):
    truncated = sorted((digits_copy / "train" / "3").glob("*.jpg"))[0]
    gif = sorted((digits_copy / "val" / "7").glob("*.jpg"))[0]
    _truncate(truncated)
    _as_gif(gif)
    args = ["data=imagefolder", f"data.root={digits_copy}", "epochs=1", *TINY, *LIGHTNING_QUIET]
    refused = run_cli(*args, cwd=tmp_path)
    fails_with(refused, "cannot decode", "data.bad_files=skip")
    assert not [p for p in tmp_path.glob("outputs/**/*") if p.is_file()], "a refused attempt writes nothing"

    run_dir = tmp_path / "run"
    out = run_cli(*args, "data.bad_files=skip", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "leaving out 2 image file(s)" in out.stdout
    assert _listed(run_dir) == {str(truncated), str(gif)}
    summary = read_summary(run_dir)
    assert summary["val_images"] == 359, "the digits' 360 validation images but the GIF, each scored once"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(summary["mlflow_run_id"])
    assert (run.data.params["dataset/num_train"], run.data.params["dataset/num_val"]) == ("1436", "359")
    assert "skipped_files.txt" in {a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.mark.keras  # trains in this process
def test_a_coco_set_with_a_truncated_jpeg_and_a_gif_trains_without_them_and_their_boxes(tmp_path):
    root = write_rectangles_coco(tmp_path / "coco", num_train=24, num_val=8)
    train = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    truncated = root / "train2017" / train["images"][0]["file_name"]
    boxes_gone = sum(a["image_id"] == train["images"][0]["id"] for a in train["annotations"])
    val = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    gif = root / "val2017" / val["images"][0]["file_name"]
    _truncate(truncated)
    _as_gif(gif)
    run_dir = tmp_path / "run"
    overrides = ["task=detection", "data=coco", f"data.root={root}", "data.image_size=128", "data.batch_size=4"]
    # in this process: what is checked is what the run leaves out, not the command line (the test above)
    runner.run(
        compose_config(
            [*overrides, "data.bad_files=skip", "epochs=1", "backend=keras", *KERAS_QUIET],
            tmp_path,
            tmp_path / "data",
            run_dir,
        )
    )
    assert _listed(run_dir) == {str(truncated), str(gif)}
    summary = read_summary(run_dir)
    assert summary["val_images"] == 7 and summary["train_images"] == 20, "23 images left: 5 whole batches of 4"
    run = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(summary["mlflow_run_id"])
    assert int(run.data.params["dataset/train_boxes"]) == len(train["annotations"]) - boxes_gone


def test_skip_without_a_check_to_find_the_files_is_refused(tmp_path, data_dir):
    fails_with(
        run_cli("data.bad_files=skip", "data.verify=off", f"paths.data_dir={data_dir}", cwd=tmp_path),
        "data.bad_files=skip with data.verify=off",
        "data.verify=quick",
    )


def test_under_hydralis_own_two_processes_the_files_are_checked_once_and_both_leave_out_the_same(tmp_path, digits_copy):
    truncated = sorted((digits_copy / "train" / "3").glob("*.jpg"))[0]
    _truncate(truncated)
    run_dir = tmp_path / "run"
    args = ["data=imagefolder", f"data.root={digits_copy}", "data.bad_files=skip", "epochs=1", *TINY]
    ddp = ["backend.accelerator=cpu", "backend.devices=2", "backend.strategy=ddp", *LIGHTNING_QUIET]
    out = run_cli(*args, *ddp, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("checking 1797 image files") == 1, "the job's process checks; its 2 processes do not"
    assert out.stdout.count("leaving out 1 image file(s)") == 1, out.stdout[-3000:]
    assert _listed(run_dir) == {str(truncated)}
    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and summary["val_images"] == 360
    assert summary["history"][0]["train/images"] <= 1435, "both processes trained without the truncated file"
