"""Detection data: the bundled digits are deterministic, boxed tightly and read by DALI's real COCO reader as their
files say; a user's COCO set is checked (each mistake named in one line), cleaned (clipped, degenerate boxes
dropped, counted in the log) and its category ids mapped to DALI's labels."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hydrali.core.errors import HydraliError
from hydrali.tasks.detection.coco import contiguous_labels, scan_coco
from hydrali.tasks.detection.digits import render_digits_image, write_digits_detection
from hydrali.tasks.detection.evaluation import category_ids_of
from tests.support.cli import REPO, start_cli

DIGITS = dict(num_train=40, num_val=12, canvas=128, min_digits=1, max_digits=5, min_size=16, max_size=48, seed=0)
DRAW = {k: DIGITS[k] for k in ("seed", "canvas", "min_digits", "max_digits", "min_size", "max_size")}
VISIBLE = 100  # grey levels: the strongest change a digit makes to its background is at least this


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory) -> Path:
    """The bundled detection digits, written once for this module."""
    return write_digits_detection(tmp_path_factory.mktemp("det") / "digits", **DIGITS)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _files(root: Path) -> dict[str, bytes]:
    """Every file under `root` by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _boxes_by_image(coco: dict) -> dict[int, list[dict]]:
    by_image = {image["id"]: [] for image in coco["images"]}
    for annotation in coco["annotations"]:
        by_image[annotation["image_id"]].append(annotation)
    return by_image


def _dali_read(images_dir: Path, annotation_file: Path, count: int) -> tuple[int, list[dict]]:
    """What DALI's COCO reader (CPU) reads in one batch of `count`: its epoch size and per sample the decoded
    image's shape, boxes (ltrb, relative), labels and image id."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=count, num_threads=1, device_id=None)
    def read():
        jpegs, boxes, labels, ids = fn.readers.coco(
            file_root=str(images_dir),
            annotations_file=str(annotation_file),
            ltrb=True,
            ratio=True,
            image_ids=True,
            name="Reader",
        )
        return fn.decoders.image(jpegs, device="cpu"), boxes, labels, ids

    pipe = read()
    pipe.build()
    images, boxes, labels, ids = pipe.run()
    samples = [
        {
            "shape": np.array(images.at(k)).shape,
            "boxes": np.array(boxes.at(k)),
            "labels": np.array(labels.at(k)),
            "id": int(np.array(ids.at(k)).ravel()[0]),
        }
        for k in range(count)
    ]
    return pipe.epoch_size("Reader"), samples


def _relative_ltrb(bbox: list[float], width: float, height: float) -> list[float]:
    x, y, w, h = bbox
    return [x / width, y / height, (x + w) / width, (y + h) / height]


def _check_dali_reads_the_file(images_dir: Path, annotation_file: Path) -> list[dict]:
    """DALI reads every image of the file once, at its size, with its boxes and categories as labels 1..K."""
    coco = _json(annotation_file)
    images = {image["id"]: image for image in coco["images"]}
    labels = contiguous_labels(c["id"] for c in coco["categories"])
    epoch, samples = _dali_read(images_dir, annotation_file, len(images))
    assert epoch == len(images)
    assert sorted(s["id"] for s in samples) == sorted(images), "every image read exactly once"
    by_image = _boxes_by_image(coco)
    for sample in samples:
        image = images[sample["id"]]
        assert sample["shape"] == (image["height"], image["width"], 3)
        expected = by_image[sample["id"]]
        assert sample["boxes"].shape == (len(expected), 4)
        want = [_relative_ltrb(a["bbox"], image["width"], image["height"]) for a in expected]
        np.testing.assert_allclose(sample["boxes"].reshape(-1, 4), np.array(want).reshape(-1, 4), atol=1e-6)
        assert sample["labels"].tolist() == [labels[a["category_id"]] for a in expected]
    return samples


# --- the bundled digits ---------------------------------------------------------------------------------


def test_the_same_seed_writes_the_same_bytes_another_seed_others(tmp_path):
    small = {**DIGITS, "num_train": 6, "num_val": 3}
    first = _files(write_digits_detection(tmp_path / "a", **small))
    again = _files(write_digits_detection(tmp_path / "b", **small))
    other = _files(write_digits_detection(tmp_path / "c", **{**small, "seed": 1}))
    assert first == again
    assert "train2017/000001.jpg" in first and "annotations/instances_val2017.json" in first
    jpegs = [name for name in first if name.endswith(".jpg")]
    assert len(jpegs) == 9 and all(first[name] != other[name] for name in jpegs)
    assert first["annotations/instances_train2017.json"] != other["annotations/instances_train2017.json"]


def test_the_layout_categories_and_ids_are_coco(digits_root):
    assert sorted(p.name for p in digits_root.iterdir() if p.is_dir()) == ["annotations", "train2017", "val2017"]
    for folder, count in (("train2017", DIGITS["num_train"]), ("val2017", DIGITS["num_val"])):
        coco = _json(digits_root / "annotations" / f"instances_{folder}.json")
        assert [(c["id"], c["name"]) for c in coco["categories"]] == [(d + 1, str(d)) for d in range(10)]
        assert sorted(p.name for p in (digits_root / folder).iterdir()) == [f"{i:06d}.jpg" for i in range(1, count + 1)]
        assert sorted(i["file_name"] for i in coco["images"]) == [f"{i:06d}.jpg" for i in range(1, count + 1)]
        assert len({i["id"] for i in coco["images"]}) == count
        assert len({a["id"] for a in coco["annotations"]}) == len(coco["annotations"])
        per_image = [len(boxes) for boxes in _boxes_by_image(coco).values()]
        assert min(per_image) >= DIGITS["min_digits"] and max(per_image) <= DIGITS["max_digits"]


def test_train_and_val_draw_from_disjoint_scans_of_the_right_digit(digits_root):
    from sklearn.datasets import load_digits

    targets = load_digits().target
    scans = {}
    for split in ("train2017", "val2017"):
        coco = _json(digits_root / "annotations" / f"instances_{split}.json")
        names = {c["id"]: c["name"] for c in coco["categories"]}
        scans[split] = {a["scan_index"] for a in coco["annotations"]}
        assert all(names[a["category_id"]] == str(targets[a["scan_index"]]) for a in coco["annotations"])
    assert len(scans["train2017"]) > 40 and len(scans["val2017"]) > 10
    assert not scans["train2017"] & scans["val2017"]


def test_every_box_is_the_tight_box_of_its_ink_inside_the_canvas(digits_root):
    coco = _json(digits_root / "annotations" / "instances_train2017.json")
    canvas = DIGITS["canvas"]
    polarities = set()
    for image_id, boxes in _boxes_by_image(coco).items():
        drawn = render_digits_image("train", image_id - 1, **DRAW)
        assert [a["bbox"] for a in boxes] == [list(d.bbox) for d in drawn.digits], "the file boxes what was drawn"
        written = np.asarray(Image.open(digits_root / "train2017" / f"{image_id:06d}.jpg"), np.float32)
        assert written.shape == (canvas, canvas, 3)
        assert np.abs(written - drawn.image).mean() < 4, "the JPEG file is the drawn image"
        change = np.abs(drawn.image.astype(int) - drawn.background.astype(int)).max(axis=2)
        inside = np.zeros((canvas, canvas), bool)
        for a in boxes:
            x, y, w, h = a["bbox"]
            assert a["area"] == w * h and a["iscrowd"] == 0
            assert 0 <= x and 0 <= y and w > 0 and h > 0 and x + w <= canvas and y + h <= canvas
            ink = change[y : y + h, x : x + w]
            assert ink[0].any() and ink[-1].any() and ink[:, 0].any() and ink[:, -1].any(), "tight on every side"
            assert ink.max() >= VISIBLE, "clearly visible"
            inside[y : y + h, x : x + w] = True
            delta = drawn.image[y : y + h, x : x + w].astype(int) - drawn.background[y : y + h, x : x + w].astype(int)
            polarities.add(int(np.sign(delta.sum())))
        assert not change[~inside].any(), "no ink outside the boxes"
    assert polarities == {-1, 1}, "digits are drawn both lighter and darker than their background"


def test_dali_reads_the_digits_as_their_files_say(digits_root):
    for split in ("train2017", "val2017"):
        annotation_file = digits_root / "annotations" / f"instances_{split}.json"
        samples = _check_dali_reads_the_file(digits_root / split, annotation_file)
        labels = np.concatenate([s["labels"] for s in samples])
        assert labels.min() >= 1 and labels.max() <= 10 and len(set(labels.tolist())) >= 8
        # the digits' category ids are 1..10 already: DALI's label is the file's category id
        coco = _json(annotation_file)
        assert sorted(labels.tolist()) == sorted(a["category_id"] for a in coco["annotations"])


def test_the_digits_pass_the_coco_checks_unchanged(digits_root, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="hydrali"):
        info = scan_coco(digits_root, clean_dir=tmp_path / "clean")
    assert not caplog.records and not (tmp_path / "clean").exists()
    assert info.train.annotation_file == digits_root / "annotations" / "instances_train2017.json"
    assert (info.num_train, info.num_val, info.num_classes) == (DIGITS["num_train"], DIGITS["num_val"], 10)
    assert info.category_names == tuple(str(d) for d in range(10))
    val = _json(digits_root / "annotations" / "instances_val2017.json")
    assert info.params()["dataset/val_boxes"] == len(val["annotations"])


def test_other_settings_in_the_same_folder_are_refused(digits_root):
    assert write_digits_detection(digits_root, **DIGITS) == digits_root
    with pytest.raises(HydraliError, match="seed=0 there, 1 now") as err:
        write_digits_detection(digits_root, **{**DIGITS, "seed": 1})
    assert str(digits_root) in str(err.value) and "\n" not in str(err.value)


def test_processes_writing_at_once_end_with_one_whole_dataset(tmp_path):
    root = tmp_path / "shared"
    small = {**DIGITS, "num_train": 30, "num_val": 5}
    code = (
        "import sys; from hydrali.tasks.detection.digits import write_digits_detection as w; "
        f"w(sys.argv[1], **{small!r})"
    )
    procs = [start_cli(str(root), cwd=REPO, entry=("-c", code), stdout=None, stderr=subprocess.PIPE) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    assert os.listdir(tmp_path) == ["shared"], "no temporary folder left behind"
    assert _files(root) == _files(write_digits_detection(tmp_path / "alone", **small))


# --- a user's COCO set ----------------------------------------------------------------------------------

CATEGORIES = [{"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}, {"id": 11, "name": "bird"}]
TRAIN_IMAGES = [(1, "a.jpg", 80, 50), (2, "b.jpg", 40, 90), (5, "c.png", 64, 64)]  # id, file, width, height
VAL_IMAGES = [(10, "v1.jpg", 70, 30), (11, "v2.jpg", 30, 70)]
TRAIN_BOXES = [
    (1, 3, [2, 3, 30, 20]),
    (1, 11, [40.5, 10, 30, 39.5]),
    (2, 7, [0, 0, 40, 90]),
    (5, 3, [10, 10, 5, 7]),
    (5, 11, [1, 2, 3, 4]),
]
VAL_BOXES = [(10, 7, [5, 5, 20, 20])]  # v2.jpg has no box


def _coco(images, boxes, categories=CATEGORIES) -> dict:
    return {
        "images": [{"id": i, "file_name": f, "width": w, "height": h} for i, f, w, h in images],
        "annotations": [
            {"id": n, "image_id": i, "category_id": c, "bbox": b, "area": b[2] * b[3], "iscrowd": 0}
            for n, (i, c, b) in enumerate(boxes, 1)
        ],
        "categories": categories,
    }


def _write_user_coco(root: Path, train_boxes=TRAIN_BOXES, categories=CATEGORIES) -> Path:
    """A small COCO set of non-square images: train2017/, val2017/, annotations/instances_*.json."""
    rng = np.random.default_rng(0)
    for folder, images in (("train2017", TRAIN_IMAGES), ("val2017", VAL_IMAGES)):
        (root / folder).mkdir(parents=True)
        for _, name, width, height in images:
            Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(root / folder / name)
    (root / "annotations").mkdir()
    _write_json(root / "annotations" / "instances_train2017.json", _coco(TRAIN_IMAGES, train_boxes, categories))
    _write_json(root / "annotations" / "instances_val2017.json", _coco(VAL_IMAGES, VAL_BOXES, categories))
    return root


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1))


def test_a_user_coco_set_is_read_with_its_categories_mapped_to_labels(tmp_path, caplog):
    root = _write_user_coco(tmp_path / "coco")
    with caplog.at_level(logging.WARNING, logger="hydrali"):
        info = scan_coco(root, clean_dir=tmp_path / "clean")
    assert not caplog.records, "nothing to fix"
    assert info.train.annotation_file == root / "annotations" / "instances_train2017.json"
    assert (info.num_train, info.num_val, info.train.num_boxes, info.val.num_boxes) == (3, 2, 5, 1)
    assert (info.num_classes, info.category_ids, info.category_names) == (3, (3, 7, 11), ("cat", "dog", "bird"))
    assert info.params() == {
        "dataset/num_classes": 3,
        "dataset/num_train": 3,
        "dataset/num_val": 2,
        "dataset/train_boxes": 5,
        "dataset/val_boxes": 1,
    }
    assert contiguous_labels(info.category_ids) == {3: 1, 7: 2, 11: 3}
    assert category_ids_of(_json(info.train.annotation_file)) == [3, 7, 11], "the evaluator maps labels back so"

    train = _check_dali_reads_the_file(info.train.images_dir, info.train.annotation_file)
    assert {s["id"]: s["labels"].tolist() for s in train} == {1: [1, 3], 2: [2], 5: [1, 3]}
    val = {s["id"]: s for s in _check_dali_reads_the_file(info.val.images_dir, info.val.annotation_file)}
    assert val[11]["boxes"].shape == (0, 4) and val[11]["shape"] == (70, 30, 3), "the image without boxes is read"


def test_categories_listed_out_of_order_are_sorted_in_a_cleaned_copy(tmp_path, caplog):
    root = _write_user_coco(tmp_path / "coco", categories=[CATEGORIES[2], CATEGORIES[0], CATEGORIES[1]])
    original = root / "annotations" / "instances_train2017.json"
    # DALI numbers labels in the order the file lists its categories: 11 -> 1, 3 -> 2, 7 -> 3
    _, as_listed = _dali_read(root / "train2017", original, 3)
    assert {s["id"]: s["labels"].tolist() for s in as_listed} == {1: [2, 1], 2: [3], 5: [2, 1]}
    with caplog.at_level(logging.WARNING, logger="hydrali"):
        info = scan_coco(root, clean_dir=tmp_path / "clean")
    assert info.train.annotation_file == tmp_path / "clean" / "train" / "instances_train2017.json"
    assert len(caplog.records) == 2 and all("sorted the categories" in r.getMessage() for r in caplog.records)
    train = _check_dali_reads_the_file(root / "train2017", info.train.annotation_file)
    assert {s["id"]: s["labels"].tolist() for s in train} == {1: [1, 3], 2: [2], 5: [1, 3]}
    assert category_ids_of(_json(info.train.annotation_file)) == [3, 7, 11], "the evaluator reads the same copy"
    # the mapping made from the user's own file, categories out of order, is what DALI reads from the copy
    labels = contiguous_labels(c["id"] for c in _json(original)["categories"])
    by_image = _boxes_by_image(_json(original))
    assert all(s["labels"].tolist() == [labels[a["category_id"]] for a in by_image[s["id"]]] for s in train)


def test_boxes_outside_the_image_are_clipped_and_empty_ones_dropped(tmp_path, caplog):
    boxes = [
        *TRAIN_BOXES,
        (1, 3, [-5, 10, 30, 20]),  # left of a.jpg (80 x 50): clipped to [0, 10, 25, 20]
        (2, 7, [20, 70, 30, 30]),  # past the right and bottom of b.jpg (40 x 90): [20, 70, 20, 20]
        (5, 11, [10, 10, 0, 5]),  # zero width: dropped
        (5, 3, [70, 10, 10, 10]),
    ]  # wholly right of c.png (64 wide): zero width once clipped, dropped
    root = _write_user_coco(tmp_path / "coco", train_boxes=boxes)
    _edit_json(root / TRAIN_JSON, lambda d: d["annotations"][0].pop("area"))  # [2, 3, 30, 20]: area 600
    original_text = (root / "annotations" / "instances_train2017.json").read_text()
    with caplog.at_level(logging.WARNING, logger="hydrali"):
        info = scan_coco(root, clean_dir=tmp_path / "clean")
    (record,) = caplog.records
    message = record.getMessage()
    assert "instances_train2017.json" in message and "clipped 2 box" in message and "dropped 2 box" in message
    assert "gave 1 box(es) without `area`" in message
    assert (root / "annotations" / "instances_train2017.json").read_text() == original_text, "the user's file is kept"
    assert info.train.num_boxes == 7 and info.val.annotation_file == root / "annotations" / "instances_val2017.json"
    cleaned = _json(info.train.annotation_file)
    assert [a["bbox"] for a in cleaned["annotations"][-2:]] == [[0, 10, 25, 20], [20, 70, 20, 20]]
    assert [a["area"] for a in cleaned["annotations"][-2:]] == [500, 400] and cleaned["annotations"][0]["area"] == 600

    samples = _check_dali_reads_the_file(root / "train2017", info.train.annotation_file)
    read = np.concatenate([s["boxes"] for s in samples])
    assert len(read) == 7 and read.min() >= 0 and read.max() <= 1

    written = info.train.annotation_file.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hydrali"):
        assert scan_coco(root, clean_dir=tmp_path / "clean") == info
    assert len(caplog.records) == 1, "the fixes are said on every scan"
    assert info.train.annotation_file.stat().st_mtime_ns == written, "an up-to-date cleaned copy is not rewritten"


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    _write_json(path, data)


TRAIN_JSON = "annotations/instances_train2017.json"
VAL_JSON = "annotations/instances_val2017.json"

# Each: how to damage the user set, what the message must name (beside the file, given first), and which root.
ERRORS = {
    "root missing": (lambda root: shutil.rmtree(root), "", "data.root="),
    "image folder missing": (lambda root: shutil.rmtree(root / "val2017"), "val2017", "is missing"),
    "annotation file missing": (lambda root: (root / TRAIN_JSON).unlink(), TRAIN_JSON, "is missing"),
    "annotation file empty": (lambda root: (root / TRAIN_JSON).write_text(" \n"), TRAIN_JSON, "is empty"),
    "not JSON": (
        lambda root: (root / VAL_JSON).write_text('{"images": [\n  {"id": 1,, }]}'),
        VAL_JSON,
        "line 2, column 12",
    ),
    "no images list": (
        lambda root: _edit_json(root / TRAIN_JSON, lambda d: d.pop("images")),
        TRAIN_JSON,
        "no `images` list",
    ),
    "no annotations list": (
        lambda root: _edit_json(root / TRAIN_JSON, lambda d: d.update(annotations={})),
        TRAIN_JSON,
        "no `annotations` list",
    ),
    "no categories list": (
        lambda root: _edit_json(root / VAL_JSON, lambda d: d.pop("categories")),
        VAL_JSON,
        "no `categories` list",
    ),
    "unknown image id": (
        lambda root: _edit_json(root / TRAIN_JSON, lambda d: d["annotations"][1].update(image_id=4)),
        TRAIN_JSON,
        "annotation id=2 has image_id=4",
    ),
    "unknown category id": (
        lambda root: _edit_json(root / VAL_JSON, lambda d: d["annotations"][0].update(category_id=5)),
        VAL_JSON,
        "category_id=5, not one of the file's category ids (3, 7, 11)",
    ),
    "image files missing": (
        lambda root: [(root / "train2017" / n).unlink() for n in ("b.jpg", "c.png")],
        "train2017/b.jpg (and 1 more)",
        TRAIN_JSON,
    ),
    "different categories": (
        lambda root: _edit_json(root / VAL_JSON, lambda d: d["categories"].pop()),
        VAL_JSON,
        "only in train: 11 (bird)",
    ),
    "no images": (
        lambda root: _edit_json(root / VAL_JSON, lambda d: d.update(images=[], annotations=[])),
        VAL_JSON,
        "lists no images",
    ),
    "bad box": (
        lambda root: _edit_json(root / VAL_JSON, lambda d: d["annotations"][0].update(bbox=[1, 2, 3])),
        VAL_JSON,
        "annotation id=1 has bbox=[1, 2, 3]",
    ),
    "image without size": (
        lambda root: _edit_json(root / TRAIN_JSON, lambda d: d["images"][1].pop("height")),
        TRAIN_JSON,
        "image id=2 (b.jpg)",
    ),
}


@pytest.mark.parametrize("case", ERRORS)
def test_each_mistake_in_a_coco_set_is_named_in_one_line(case, tmp_path):
    damage, names, says = ERRORS[case]
    root = _write_user_coco(tmp_path / "coco")
    damage(root)
    with pytest.raises(HydraliError) as err:
        scan_coco(root, clean_dir=tmp_path / "clean")
    message = str(err.value)
    assert "\n" not in message
    assert str(root / names) in message and says in message, message


def test_a_refused_coco_set_writes_no_cleaned_copy(tmp_path):
    root = _write_user_coco(tmp_path / "coco", categories=[CATEGORIES[2], CATEGORIES[0], CATEGORIES[1]])  # to clean
    _edit_json(root / VAL_JSON, lambda d: d["categories"].pop(0))  # and refused: the splits' categories differ
    with pytest.raises(HydraliError, match="different categories"):
        scan_coco(root, clean_dir=tmp_path / "clean")
    assert not (tmp_path / "clean").exists(), "the train split's cleaned copy is not written for a refused set"
