"""COCO mAP of the detection task: conversion of model outputs, and mAP values known by hand.

COCO's AP, for one category at one IoU threshold: detections of all images sorted by score,
each matched greedily to the best still-unmatched ground truth with IoU >= threshold (a true
positive) or else a false positive; precision and recall after each detection; precision made
non-increasing from the right ("interpolated": at recall r, the best precision at recall >= r);
AP = mean of that precision at the 101 recall points 0, 0.01, ..., 1 (0 past the last recall
reached). mAP averages over the categories that have ground truth and, for val/map, over the
ten IoU thresholds 0.50, 0.55, ..., 0.95; val/map50 uses 0.50 only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hydrali.tasks.detection.evaluation import (
    MAP50_KEY,
    MAP_KEY,
    CocoEvaluator,
    category_ids_of,
    to_coco_detections,
)

RECALL_POINTS = 101
IOU_THRESHOLDS = 10
WIDTH, HEIGHT = 200, 100  # a non-square image
CATEGORIES = (3, 7, 11)  # non-contiguous, as in COCO's own files


def _gt(annotations, categories=CATEGORIES, images=(1, 2, 3)):
    """A COCO ground truth: WIDTH x HEIGHT images, annotations given as (image_id, category_id, [x, y, w, h])."""
    return {
        "images": [{"id": i, "file_name": f"{i}.jpg", "width": WIDTH, "height": HEIGHT} for i in images],
        "categories": [{"id": c, "name": f"c{c}"} for c in categories],
        "annotations": [
            {"id": n, "image_id": i, "category_id": c, "bbox": list(b), "area": b[2] * b[3], "iscrowd": 0}
            for n, (i, c, b) in enumerate(annotations, start=1)
        ],
    }


def _ltrb(bbox, width=WIDTH, height=HEIGHT):
    """Pixel [x, y, w, h] -> ltrb normalized to the image, as the models predict."""
    x, y, w, h = bbox
    return [x / width, y / height, (x + w) / width, (y + h) / height]


def _add(evaluator, detections):
    """Adds model-like outputs given as (image_id, label, pixel [x, y, w, h], score), grouped per image."""
    image_ids = sorted({d[0] for d in detections})
    per_image = [[d for d in detections if d[0] == i] for i in image_ids]
    evaluator.add_batch(
        image_ids,
        [np.array([_ltrb(d[2]) for d in ds], dtype=np.float32).reshape(-1, 4) for ds in per_image],
        [np.array([d[3] for d in ds], dtype=np.float32) for ds in per_image],
        [np.array([d[1] for d in ds]) for ds in per_image],
    )


def _score(ground_truth, detections, **options):
    evaluator = CocoEvaluator(ground_truth, **options)
    _add(evaluator, detections)
    return evaluator.compute()


# image 1 has a box of each category, image 2 two boxes of category 7, image 3 nothing
BOXES = [
    (1, 3, [10, 10, 50, 40]),
    (1, 7, [100, 20, 60, 60]),
    (1, 11, [0, 0, 200, 100]),
    (2, 7, [5, 5, 30, 30]),
    (2, 7, [120, 50, 40, 45]),
]
LABEL = {c: k for k, c in enumerate(CATEGORIES, start=1)}  # file id -> contiguous label


def _perfect(boxes=BOXES, label=LABEL):
    return [(i, label[c], b, 0.9) for i, c, b in boxes]


# --- conversion -----------------------------------------------------------------------------


def test_normalized_ltrb_becomes_pixel_xywh_of_a_non_square_image():
    (det,) = to_coco_detections(
        [42], [np.array([[0.1, 0.2, 0.6, 0.9]])], [np.array([0.75])], [np.array([2])], [(HEIGHT, WIDTH)], CATEGORIES
    )
    assert det["image_id"] == 42 and det["category_id"] == 7 and det["score"] == pytest.approx(0.75)
    # x: 0.1 * 200, y: 0.2 * 100, w: 0.5 * 200, h: 0.7 * 100
    assert det["bbox"] == pytest.approx([20.0, 20.0, 100.0, 70.0])
    assert all(type(v) is float for v in det["bbox"]) and type(det["category_id"]) is int


def test_boxes_are_clipped_and_background_padding_and_empty_boxes_left_out():
    boxes = np.array(
        [
            [-0.1, 0.5, 1.2, 1.1],  # over the edges: clipped
            [0.1, 0.1, 0.2, 0.2],  # background label
            [0.1, 0.1, 0.2, 0.2],  # padding label -1
            [0.3, 0.1, 0.3, 0.5],  # zero width
            [1.1, 0.1, 1.3, 0.5],  # wholly outside: empty once clipped
            [0.1, 0.1, 0.2, 0.2],
        ]
    )  # NaN score
    dets = to_coco_detections(
        [1],
        [boxes],
        [np.array([0.9, 0.9, 0.9, 0.9, 0.9, np.nan])],
        [np.array([3, 0, -1, 1, 1, 2])],
        [(HEIGHT, WIDTH)],
        CATEGORIES,
    )
    assert [d["category_id"] for d in dets] == [11]
    assert dets[0]["bbox"] == pytest.approx([0.0, 50.0, 200.0, 50.0])


def test_padded_arrays_use_the_count_of_each_image():
    boxes = np.tile(np.array([0.1, 0.1, 0.5, 0.5]), (2, 3, 1))  # 2 images padded to 3 detections
    scores, labels = np.full((2, 3), 0.5), np.ones((2, 3))
    dets = to_coco_detections([1, 2], boxes, scores, labels, [(HEIGHT, WIDTH)] * 2, CATEGORIES, counts=[2, 0])
    assert [d["image_id"] for d in dets] == [1, 1]


def test_a_label_above_the_categories_is_refused():
    with pytest.raises(ValueError, match="label 4"):
        to_coco_detections(
            [1], [np.array([[0.1, 0.1, 0.5, 0.5]])], [np.array([0.5])], [np.array([4])], [(HEIGHT, WIDTH)], CATEGORIES
        )


def test_labels_follow_the_file_order_of_categories_as_dali_numbers_them():
    # DALI's readers.coco numbers categories 1..K in the order of the file's list (checked on DALI 2.4:
    # a file listing 11, 3, 7 gives 11 -> 1, 3 -> 2, 7 -> 3), not by sorted id
    ground_truth = _gt([(1, 3, [10, 10, 50, 40]), (1, 11, [100, 20, 60, 60])], categories=(11, 3, 7))
    evaluator = CocoEvaluator(ground_truth)
    assert evaluator.category_ids == category_ids_of(ground_truth) == [11, 3, 7]
    _add(evaluator, [(1, 2, [10, 10, 50, 40], 0.9), (1, 1, [100, 20, 60, 60], 0.9)])
    assert {d["category_id"] for d in evaluator.detections} == {3, 11}
    assert evaluator.compute() == {MAP_KEY: pytest.approx(1.0), MAP50_KEY: pytest.approx(1.0)}


# --- mAP values known by hand ----------------------------------------------------------------


def test_perfect_detections_score_one_with_an_image_without_ground_truth():
    # image 3 has no ground truth and no detection: it changes nothing
    assert _score(_gt(BOXES), _perfect()) == {MAP_KEY: pytest.approx(1.0), MAP50_KEY: pytest.approx(1.0)}


def test_wrong_class_or_far_away_scores_zero():
    wrong_class = [(i, LABEL[CATEGORIES[(CATEGORIES.index(c) + 1) % 3]], b, 0.9) for i, c, b in BOXES]
    far_away = [(i, LABEL[c], [b[0] + b[2], b[1] + b[3], 1, 1], 0.9) for i, c, b in BOXES]
    assert _score(_gt(BOXES), wrong_class) == {MAP_KEY: 0.0, MAP50_KEY: 0.0}
    assert _score(_gt(BOXES), far_away) == {MAP_KEY: 0.0, MAP50_KEY: 0.0}


def test_one_of_two_boxes_found_gives_51_of_101_points():
    # one category, two ground-truth boxes, one exact detection: after it, precision 1 and recall
    # 1/2. Interpolated precision is 1 at the recall points 0, 0.01, ..., 0.50 (51 points: 0.50
    # counts, recall >= 0.50 being reached; np.linspace(0, 1, 101)[50] is exactly 0.5) and 0 at the
    # 50 points above: AP = 51/101 at every IoU threshold (IoU 1), so map = map50 = 51/101
    boxes = [(1, 3, [10, 10, 50, 40]), (1, 3, [100, 20, 60, 60])]
    result = _score(_gt(boxes), [(1, 1, [10, 10, 50, 40], 0.9)])
    assert result == {MAP_KEY: pytest.approx(51 / RECALL_POINTS), MAP50_KEY: pytest.approx(51 / RECALL_POINTS)}


def test_one_category_perfect_and_one_missed_gives_half():
    # AP 1 for category 3, AP 0 for category 7 (ground truth, no detection): mean 0.5
    boxes = [(1, 3, [10, 10, 50, 40]), (2, 7, [5, 5, 30, 30])]
    assert _score(_gt(boxes), [(1, 1, [10, 10, 50, 40], 0.9)]) == {
        MAP_KEY: pytest.approx(0.5),
        MAP50_KEY: pytest.approx(0.5),
    }


def test_a_false_positive_on_an_image_without_ground_truth_ranked_first_halves_ap():
    # ranked: the false positive (score 0.9, on image 3 which has no ground truth), then the true
    # positive (0.8): precision 0 then 1/2, recall 0 then 1. Interpolated precision at every recall
    # point 0..1 is the best precision at recall >= it, 1/2: AP = 0.5. Scored the other way round
    # (true positive first) the false positive would come after full recall and change nothing.
    boxes = [(1, 3, [10, 10, 50, 40])]
    detections = [(3, 1, [10, 10, 50, 40], 0.9), (1, 1, [10, 10, 50, 40], 0.8)]
    assert _score(_gt(boxes), detections) == {MAP_KEY: pytest.approx(0.5), MAP50_KEY: pytest.approx(0.5)}
    swapped = [(3, 1, [10, 10, 50, 40], 0.8), (1, 1, [10, 10, 50, 40], 0.9)]
    assert _score(_gt(boxes), swapped) == {MAP_KEY: pytest.approx(1.0), MAP50_KEY: pytest.approx(1.0)}


def test_a_box_at_iou_062_counts_at_thresholds_050_055_060_only():
    # ground truth 100 x 100, prediction its top 100 x 62: IoU = 6200 / 10000 = 0.62, a true
    # positive at IoU thresholds 0.50, 0.55, 0.60 (AP 1) and a miss at 0.65 ... 0.95 (AP 0):
    # map = 3/10, map50 = 1 (0.62 is far enough from 0.60 and 0.65 for floating point)
    boxes = [(1, 3, [50, 0, 100, 100])]
    result = _score(_gt(boxes), [(1, 1, [50, 0, 100, 62], 0.9)])
    assert result == {MAP_KEY: pytest.approx(3 / IOU_THRESHOLDS), MAP50_KEY: pytest.approx(1.0)}


def test_contiguous_labels_map_back_to_non_contiguous_ids_and_a_wrong_mapping_scores_lower():
    # categories 3, 7, 11 in the file; the model says 1, 2, 3
    right = _score(_gt(BOXES), _perfect())
    swapped_label = {3: 2, 7: 1, 11: 3}  # labels of 3 and 7 exchanged
    wrong = _score(_gt(BOXES), _perfect(label=swapped_label))
    assert right[MAP_KEY] == pytest.approx(1.0)
    assert wrong[MAP_KEY] < right[MAP_KEY] and wrong[MAP50_KEY] < right[MAP50_KEY]
    assert wrong[MAP_KEY] == pytest.approx(1 / 3)  # only category 11 is still right


def test_no_detections_at_all_score_zero():
    evaluator = CocoEvaluator(_gt(BOXES))
    assert evaluator.compute() == {MAP_KEY: 0.0, MAP50_KEY: 0.0}
    evaluator.add_batch([1, 2], [np.zeros((0, 4))] * 2, [np.zeros(0)] * 2, [np.zeros(0)] * 2)
    assert evaluator.compute() == {MAP_KEY: 0.0, MAP50_KEY: 0.0}
    assert CocoEvaluator(_gt(BOXES), seen_images_only=True).compute() == {MAP_KEY: 0.0, MAP50_KEY: 0.0}


def test_seen_images_only_scores_the_images_added():
    # only image 2 seen, both its boxes found; image 1's boxes count only when all images are scored
    found = [d for d in _perfect() if d[0] == 2]
    assert _score(_gt(BOXES), found, seen_images_only=True) == {
        MAP_KEY: pytest.approx(1.0),
        MAP50_KEY: pytest.approx(1.0),
    }
    assert _score(_gt(BOXES), found)[MAP_KEY] < 1.0


# --- collecting across batches and processes ---------------------------------------------------


def test_shards_gathered_into_one_evaluator_score_as_one_pass_and_count_each_image_once():
    shards = [CocoEvaluator(_gt(BOXES)) for _ in range(2)]
    _add(shards[0], [d for d in _perfect() if d[0] == 1])
    _add(shards[0], [d for d in _perfect() if d[0] == 1])  # padding repeats the last sample: skipped
    _add(shards[1], [d for d in _perfect() if d[0] == 2])
    gathered = json.loads(json.dumps([(s.detections, s.image_ids) for s in shards]))  # any transport
    for detections, image_ids in gathered:
        shards[0].add(detections, image_ids)  # its own share included: skipped, already added
    assert len(shards[0].detections) == len(BOXES)
    assert shards[0].image_ids == [1, 2]
    assert shards[0].compute() == {MAP_KEY: pytest.approx(1.0), MAP50_KEY: pytest.approx(1.0)}


def test_compute_is_silent_repeatable_and_leaves_inputs_alone(capfd, tmp_path):
    ground_truth = _gt(BOXES)
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(ground_truth))
    for source in (ground_truth, path):
        evaluator = CocoEvaluator(source)
        _add(evaluator, _perfect())
        before = json.dumps(evaluator.detections)
        assert (
            evaluator.compute() == evaluator.compute() == {MAP_KEY: pytest.approx(1.0), MAP50_KEY: pytest.approx(1.0)}
        )
        assert json.dumps(evaluator.detections) == before
    assert ground_truth == _gt(BOXES)
    assert capfd.readouterr() == ("", "")


def test_unknown_images_and_categories_are_refused():
    evaluator = CocoEvaluator(_gt(BOXES))
    with pytest.raises(ValueError, match="image id"):
        _add(evaluator, [(99, 1, [10, 10, 5, 5], 0.5)])
    with pytest.raises(ValueError, match="category id"):
        evaluator.add([{"image_id": 1, "category_id": 1, "bbox": [10, 10, 5, 5], "score": 0.5}])
    with pytest.raises(ValueError, match="missing from image_ids"):
        evaluator.add([{"image_id": 1, "category_id": 3, "bbox": [10, 10, 5, 5], "score": 0.5}], image_ids=[2])
