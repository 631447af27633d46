"""The detection recipes against what DALI actually emits: boxes stay on their objects through crop, flip and
resize; the encoded targets decode back to the annotation file's boxes on both backends' decoders; shards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from nvidia.dali import pipeline_def
from omegaconf import OmegaConf

from hydrali.core.run.epoch import make_epoch_steps
from hydrali.tasks.detection import anchors as anchor_lib
from hydrali.tasks.detection.coco import scan_coco
from hydrali.tasks.detection.evaluation import category_ids_of
from hydrali.tasks.detection.layout import (
    BACKGROUND,
    BOX_VALUES,
    FIRST_OBJECT_LABEL,
    IMAGE_ID_COLUMNS,
    IMAGE_IDS_OUTPUT,
    LABEL_COLUMN,
    TARGET_COLUMNS,
    TRAINING_OUTPUTS,
    VALIDATION_OUTPUTS,
)
from hydrali.tasks.detection.recipes import CocoSource, read_coco, scale_jitter, ssd
from hydrali.tasks.detection.torch_decode import decode_boxes
from tests.support.cli import REPO
from tests.support.datasets import EMPTY_VAL_IMAGE, write_rectangles_coco

SIZE = 128
BATCH = 8
ANCHORS = anchor_lib.default_boxes(anchor_lib.anchor_spec(SIZE, {"strides": [8, 16, 32], "max_scale": 0.6}))
RECIPES = {"ssd": ssd, "scale_jitter": scale_jitter}
SATURATED = 60  # grey levels between an object pixel's strongest and weakest channel, at least
COVERED = 0.7  # share of a box's pixels that must be its object's


@pytest.fixture(scope="module")
def rectangles(tmp_path_factory):
    root = write_rectangles_coco(tmp_path_factory.mktemp("rect") / "coco", num_train=24, num_val=8)
    return scan_coco(root, clean_dir=root.parent / "clean")


def options(recipe: str, **changes) -> dict:
    """The recipe's options as conf/pipeline/<recipe>.yaml sets them, with `changes`."""
    return {**OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "pipeline" / f"{recipe}.yaml").options), **changes}


def run_recipe(recipe: str, split, is_training: bool, *, shard=(0, 1), batches=1, layout="HWC", **changes) -> list:
    source = CocoSource(
        str(split.images_dir), shard[0], shard[1], is_training, annotation_file=str(split.annotation_file)
    )
    pipe = RECIPES[recipe](
        batch_size=BATCH,
        num_threads=1,
        device_id=None,
        seed=3,
        prefetch_queue_depth=1,
        source=source,
        device="cpu",
        layout=layout,
        image_size=SIZE,
        dtype="float",
        hw_decoder_load=0.65,
        anchors=ANCHORS,
        **options(recipe, **changes),
    )
    pipe.build()
    return [[np.array(out.as_tensor()) for out in pipe.run()] for _ in range(batches)]


def encoded_boxes(targets: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """The distinct (ltrb box, label) pairs that one image's targets encode (positive anchors decoded)."""
    positive = targets[:, LABEL_COLUMN] > BACKGROUND
    boxes = anchor_lib.decode(targets[positive, :BOX_VALUES], ANCHORS[positive])
    found = {}
    for box, label in zip(boxes, targets[positive, LABEL_COLUMN].round().astype(int)):
        found.setdefault((tuple(np.round(box, 3)), label), box)
    return [(box, label) for (_, label), box in found.items()]


@pytest.mark.parametrize("recipe", ["ssd", "scale_jitter"])
def test_the_recipes_outputs_are_laid_out_as_layout_names_them(rectangles, recipe):
    """What DALI emits is what tasks/detection/layout.py says: the outputs in order; per image, targets
    [anchors, TARGET_COLUMNS] with the box offsets first and a whole label at LABEL_COLUMN (BACKGROUND, with zero
    offsets, where no box is matched; objects from FIRST_OBJECT_LABEL on) and image ids [IMAGE_ID_COLUMNS]."""
    num_categories = len(json.loads(rectangles.val.annotation_file.read_text())["categories"])
    [training] = run_recipe(recipe, rectangles.train, True)
    [validation] = run_recipe(recipe, rectangles.val, False)
    assert (len(training), len(validation)) == (len(TRAINING_OUTPUTS), len(VALIDATION_OUTPUTS))
    assert validation[IMAGE_IDS_OUTPUT].shape == (BATCH, IMAGE_ID_COLUMNS)
    for outputs, names in ((training, TRAINING_OUTPUTS), (validation, VALIDATION_OUTPUTS)):
        targets = outputs[names.index("targets")]
        assert targets.shape == (BATCH, len(ANCHORS), TARGET_COLUMNS)
        labels = targets[..., LABEL_COLUMN]
        assert np.array_equal(labels, labels.round()) and labels.min() == BACKGROUND
        assert FIRST_OBJECT_LABEL <= labels[labels != BACKGROUND].min() <= labels.max() <= num_categories
        assert not targets[labels == BACKGROUND][:, :BOX_VALUES].any(), "unmatched anchors carry zero offsets"
        assert targets[labels != BACKGROUND][:, :BOX_VALUES].any(axis=1).all(), "matched anchors carry offsets"


@pytest.mark.parametrize("recipe", ["ssd", "scale_jitter"])
def test_augmented_boxes_stay_on_their_objects(rectangles, recipe):
    """Crop, flip (always, here) and resize move each box with its object: the pixels a box covers are its
    object's (solid, saturated colour on a grey background), whatever the colour jitter."""
    checked = 0
    for images, targets in run_recipe(recipe, rectangles.train, True, batches=3, flip_probability=1.0):
        mean, std = np.array(options(recipe)["mean"]) * 255, np.array(options(recipe)["std"]) * 255
        for image, image_targets in zip(images * std + mean, targets):
            saturated = image.max(axis=-1) - image.min(axis=-1) > SATURATED
            for box, _ in encoded_boxes(image_targets):
                left, top, right, bottom = np.round(box * SIZE).astype(int)
                inner = saturated[top + 1 : bottom - 1, left + 1 : right - 1]
                assert inner.size and inner.mean() > COVERED, (recipe, box, inner.mean() if inner.size else None)
                checked += 1
    assert checked >= 3 * BATCH, "most images keep at least one box"


def test_unflipped_boxes_would_be_caught(rectangles):
    """The check above fails on boxes that did not follow a flip of their image (it can see a wrong box)."""
    [(images, targets)] = run_recipe(
        "ssd",
        rectangles.train,
        True,
        flip_probability=1.0,
        crop_scaling=[1.0, 1.0],
        crop_aspect_ratio=[1.0, 1.0],
        crop_thresholds=[0.0],
    )
    mean, std = np.array(options("ssd")["mean"]) * 255, np.array(options("ssd")["std"]) * 255
    coverage = []
    for image, image_targets in zip(images * std + mean, targets):
        saturated = image[:, ::-1].max(axis=-1) - image[:, ::-1].min(axis=-1) > SATURATED  # flipped back
        for box, _ in encoded_boxes(image_targets):
            left, top, right, bottom = np.round(box * SIZE).astype(int)
            coverage.append(saturated[top + 1 : bottom - 1, left + 1 : right - 1].mean())
    assert min(coverage) < COVERED


@pytest.mark.keras
@pytest.mark.parametrize("recipe", ["ssd", "scale_jitter"])
def test_validation_targets_decode_to_the_files_boxes_on_both_backends(rectangles, recipe):
    """Ground truth encoded by the pipeline and decoded by the torch and the Keras decoder is the annotation
    file's boxes (within 1e-4), with labels that map back to the file's category ids."""
    from hydrali.backends.keras.quiet_start import import_tensorflow

    import_tensorflow()
    from hydrali.tasks.detection.keras_decode import decode_boxes as keras_decode_boxes

    data = json.loads(rectangles.val.annotation_file.read_text())
    sizes = {image["id"]: (image["width"], image["height"]) for image in data["images"]}
    truth = {image_id: [] for image_id in sizes}
    for a in data["annotations"]:
        (x, y, w, h), (width, height) = a["bbox"], sizes[a["image_id"]]
        truth[a["image_id"]].append(((x / width, y / height, (x + w) / width, (y + h) / height), a["category_id"]))
    category_of_label = dict(enumerate(category_ids_of(data), start=1))
    [(images, targets, image_ids)] = run_recipe(recipe, rectangles.val, False)
    assert sorted(image_ids.reshape(-1).tolist()) == sorted(sizes), "one batch holds the whole val set"
    for image_targets, image_id in zip(targets, image_ids.reshape(-1)):
        positive = image_targets[:, LABEL_COLUMN] > BACKGROUND
        offsets = image_targets[positive, :BOX_VALUES]
        decoded = {
            "torch": decode_boxes(torch.from_numpy(offsets), torch.from_numpy(ANCHORS[positive])).numpy(),
            "keras": keras_decode_boxes(offsets, ANCHORS[positive]).numpy(),
        }
        expected = truth[int(image_id)]
        if int(image_id) == EMPTY_VAL_IMAGE:
            assert not expected and not positive.any()
            continue
        labels = image_targets[positive, LABEL_COLUMN].round().astype(int)
        for name, boxes in decoded.items():
            matched = set()
            for box, label in zip(boxes, labels):
                errors = [np.abs(box - np.array(b)).max() for b, _ in expected]
                best = int(np.argmin(errors))
                assert errors[best] < 1e-4, (name, box, expected)
                assert category_of_label[label] == expected[best][1]
                matched.add(best)
            assert matched == set(range(len(expected))), "every box is encoded on some anchor"


@pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=1)
def coco_files(source):
    jpegs = read_coco(source, initial_fill=64)[0]
    return jpegs


def files_read(split, shard_id: int, num_shards: int, is_training: bool, batches: int) -> list[str]:
    """The image files DALI's COCO reader returns, batch after batch, for one shard."""
    pipe = coco_files(
        source=CocoSource(
            str(split.images_dir), shard_id, num_shards, is_training, annotation_file=str(split.annotation_file)
        )
    )
    pipe.build()
    names = []
    for _ in range(batches):
        (batch,) = pipe.run()
        names += [batch[i].source_info() for i in range(len(batch))]
    return names


def test_two_replicas_read_disjoint_training_images_and_validation_covers_each_image_once(rectangles):
    contract = make_epoch_steps(
        train_samples=rectangles.num_train, val_samples=rectangles.num_val, num_shards=2, batch=4, last_batch="drop"
    )
    # three epochs of reading: each replica stays on its own half (its shuffle buffer never reaches the other's)
    read = [set(files_read(rectangles.train, shard, 2, True, 3 * contract.train_steps)) for shard in (0, 1)]
    assert read[0].isdisjoint(read[1])
    assert len(read[0]) == len(read[1]) == rectangles.num_train // 2
    counted = []
    for shard in (0, 1):
        source = (rectangles.val, shard, 2)
        [(_, _, ids)] = run_recipe("ssd", source[0], False, shard=(shard, 2))
        ids = ids.reshape(-1).tolist()
        counted += ids[: contract.val_shard_size(shard)]
    assert sorted(counted) == sorted(
        json.loads(rectangles.val.annotation_file.read_text())["images"][i]["id"] for i in range(rectangles.num_val)
    )
