"""Detection data at scale: `hydrali convert task=detection` writes WebDataset tar shards whose images, boxes and
labels DALI reads back exactly as fn.readers.coco reads the folder (observed through DALI), and
`data=webdataset_detection` trains from them on both backends to the folder's val/map, scored by hydrali eval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from nvidia.dali import pipeline_def

from hydrali.core.data.webdataset import ShardSource, read_manifest, split_shards
from hydrali.core.run.runner import run
from hydrali.tasks.detection.recipes import CocoSource, read_coco
from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import compose_config
from tests.support.datasets import CATEGORIES, EMPTY_VAL_IMAGE, write_rectangles_coco

# Rectangles at 64 x 64 on a narrow detector, 10 epochs at a higher lr than the detector's default: seconds per run,
# and a val/map (about 0.2) that measures what was learned
SHORT = [
    "task=detection",
    "data.image_size=64",
    "data.batch_size=16",
    "model.widths=[8,16,32,64]",
    "pipeline=scale_jitter",
    "optim.lr=0.01",
    "epochs=10",
    "task.pictures=0",
]
SAME_MAP = 0.05  # |best val/map from shards - from the folder|: the same seed, the samples in another order


def convert(cwd: Path, data_dir: Path, out: Path, *args: str):
    """`hydrali convert task=detection` of the dataset `args` name (the bundled digits by default) into `out`."""
    return run_cli("convert", "task=detection", f"paths.data_dir={data_dir}", f"out={out}", *args, cwd=cwd)


@pytest.fixture(scope="module")
def rectangles(tmp_path_factory) -> Path:
    """A user's COCO set: category ids 3/7/11, non-square images, a val image without boxes."""
    return write_rectangles_coco(tmp_path_factory.mktemp("rect") / "coco", num_train=128, num_val=16)


@pytest.fixture(scope="module")
def rectangle_shards(tmp_path_factory, rectangles, data_dir) -> Path:
    root = tmp_path_factory.mktemp("rect_wds")
    out = convert(root, data_dir, root / "shards", "data=coco", f"data.root={rectangles}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "train: 128 samples in 8 shards" in out.stdout and "val  : 16 samples in 8 shards" in out.stdout, out.stdout
    assert f"task=detection data=webdataset_detection data.root={root / 'shards'}" in out.stdout, out.stdout
    return root / "shards"


def read_by_image_id(source) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """image id -> (boxes, labels) of every sample the recipes' reader gives `source` (validation) in one pass."""

    @pipeline_def(batch_size=32, num_threads=1, device_id=None, seed=3)
    def boxes_and_labels():
        _, boxes, labels, image_ids = read_coco(source, initial_fill=1)
        return boxes, labels, image_ids

    pipe = boxes_and_labels()
    pipe.build()
    size, read = pipe.epoch_size("Reader"), []
    while len(read) < size:
        boxes, labels, ids = pipe.run()
        read += [(int(ids.at(i)[0]), np.array(boxes.at(i)), np.array(labels.at(i))) for i in range(len(ids))]
    by_id = {image_id: (b, lab) for image_id, b, lab in read[:size]}
    assert len(by_id) == size, "every image once"
    return by_id


def shard_source(root: Path, split: str, is_training: bool = False) -> ShardSource:
    located = split_shards(str(root), read_manifest(str(root)), split)
    return ShardSource(str(root), 0, 1, is_training, paths=located.paths, index_paths=located.index_paths)


def test_dali_reads_from_the_shards_the_boxes_and_labels_readers_coco_reads_from_the_folder(
    tmp_path, data_dir, rectangle_shards, rectangles
):
    digits = tmp_path / "digits_shards"
    out = convert(tmp_path, data_dir, digits, "shard_size=100")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "train: 1000 samples in 10 shards" in out.stdout and "val  : 200 samples in 8 shards" in out.stdout
    folder = data_dir / "digits_detection"
    for shards, images in ((digits, folder / "val2017"), (rectangle_shards, rectangles / "val2017")):
        annotations = images.parent / "annotations/instances_val2017.json"
        from_folder = read_by_image_id(CocoSource(str(images), 0, 1, False, annotation_file=str(annotations)))
        from_shards = read_by_image_id(shard_source(shards, "val"))
        assert sorted(from_shards) == sorted(from_folder)
        for image_id, (boxes, labels) in from_folder.items():
            assert np.array_equal(from_shards[image_id][0], np.clip(boxes, 0, 1)), image_id
            assert np.array_equal(from_shards[image_id][1], labels), image_id
        assert (shards / "val/annotations.json").read_bytes() == annotations.read_bytes()  # nothing to clean here
    assert from_shards[EMPTY_VAL_IMAGE][0].shape == (0, 4) and from_shards[EMPTY_VAL_IMAGE][1].shape == (0,)
    manifest = read_manifest(str(rectangle_shards))
    assert manifest.facts["categories"] == CATEGORIES and manifest.facts["val_annotations"] == "val/annotations.json"
    assert manifest.splits["val"].samples == 16


def test_training_shards_hold_only_images_with_boxes_and_the_manifest_counts_them(tmp_path, data_dir, rectangles):
    coco = tmp_path / "coco"
    import shutil

    shutil.copytree(rectangles, coco)
    annotation_file = coco / "annotations/instances_train2017.json"
    data = json.loads(annotation_file.read_text())
    emptied = {image["id"] for image in data["images"][:5]}
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] not in emptied]
    annotation_file.write_text(json.dumps(data))
    out = convert(tmp_path, data_dir, tmp_path / "shards", "data=coco", f"data.root={coco}")
    assert out.returncode == 0, out.stderr[-3000:]
    manifest = read_manifest(str(tmp_path / "shards"))
    assert manifest.splits["train"].samples == 123 and manifest.facts["train_images_without_boxes"] == 5

    @pipeline_def(batch_size=41, num_threads=1, device_id=None, seed=3)
    def labels():
        return read_coco(shard_source(tmp_path / "shards", "train", is_training=True), initial_fill=1)[2]

    pipe = labels()
    pipe.build()
    assert pipe.epoch_size("Reader") == 123
    assert all(len(batch.at(i)) > 0 for _ in range(3) for batch in pipe.run() for i in range(len(batch)))


def test_a_detection_set_whose_val_has_no_annotation_file_is_refused_in_one_line(tmp_path, data_dir, rectangles):
    import shutil

    coco = tmp_path / "coco"
    shutil.copytree(rectangles, coco)
    (coco / "annotations/instances_val2017.json").unlink()
    fails_with(
        convert(tmp_path, data_dir, tmp_path / "shards", "data=coco", f"data.root={coco}"),
        "instances_val2017.json is missing",
    )
    assert not (tmp_path / "shards").exists() and not list(tmp_path.glob(".shards*"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend,evaluate",
    [("lightning", False), pytest.param("keras", True, marks=pytest.mark.keras)],  # keras: trains in this process
)
def test_training_from_shards_reaches_the_folders_map_and_eval_reproduces_it(
    tmp_path, data_dir, rectangles, rectangle_shards, backend, evaluate, monkeypatch
):
    """hydrali eval runs on one backend: how a backend loads its checkpoint is eval's own tests' (test_after_training),
    what differs here is the data, the same for both."""
    best = {}
    for name, data in (
        ("folder", ["data=coco", f"data.root={rectangles}"]),
        ("shards", ["data=webdataset_detection", f"data.root={rectangle_shards}"]),
    ):
        # in this process: what is checked is what a run reads from shards, not the command line
        run(compose_config([*SHORT, *data, f"backend={backend}"], tmp_path, data_dir, tmp_path / name))
        summary = read_summary(tmp_path / name)
        assert (summary["steps_per_epoch"], summary["val_images"]) == (128 // 16, 16), summary  # the epoch steps
        best[name] = summary["best"]["val/map"]
    assert abs(best["shards"] - best["folder"]) <= SAME_MAP, best
    assert best["shards"] > 0.1, best  # it learned
    if not evaluate:
        return
    # in this process too: what eval reads from shards is checked here, its command line in test_after_training
    from hydrali.core.cli.use import run_command

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        run_command("eval", [str(tmp_path / "shards")])
    assert ended.value.code == 0
    scored = json.loads((tmp_path / "shards/eval/val/metrics.json").read_text())
    assert scored["images"] == 16 and scored["metrics"]["val/map"] == pytest.approx(best["shards"], abs=1e-4)


def test_shards_in_object_storage_are_scored_against_their_own_annotation_file(tmp_path, rectangle_shards, monkeypatch):
    """(DALI reading shards from object storage is the classification tests' run from a local S3 server.)"""
    from hydrali.tasks.detection.sharded import open_shards
    from tests.support.object_store import S3Server

    with S3Server() as s3:
        s3.upload(rectangle_shards, "datasets", "rectangles")
        for name, value in s3.env.items():
            monkeypatch.setenv(name, value)
        remote = open_shards("s3://datasets/rectangles", tmp_path / "copies")
    assert remote.val.annotation_file.read_bytes() == (rectangle_shards / "val/annotations.json").read_bytes()
    assert remote.val.annotation_file.is_relative_to(tmp_path / "copies")
    assert (remote.num_train, remote.num_val, remote.category_ids) == (128, 16, (3, 7, 11))
    assert remote.train_shards.paths[0] == "s3://datasets/rectangles/train/shard-000000.tar"
