"""COCO mAP for the detection task: model outputs -> COCO result dicts -> mAP@[.5:.95] and mAP@.5.

Framework-free (numpy and faster-coco-eval only): both backends feed it numpy arrays.

The models predict, per image, boxes in ltrb format normalized to [0, 1] (relative to the
image as the model saw it, a resize of the original image, so x maps back by the original
width and y by the original height), scores, and contiguous labels 1..K, 0 being background.
DALI's ``fn.readers.coco`` numbers the categories 1..K in the order the annotation file lists
them (its ``categories`` array, not sorted by id: checked on DALI 2.4), so label k is the
file's category ``categories[k - 1]["id"]``; :func:`category_ids_of` gives that list.

Validation is sharded, so detections are plain lists of dicts that a caller gathers across
processes and adds to one :class:`CocoEvaluator`, as validation.py does with `gather_objects`
(hydrali.core.distributed.gather: through the collective the backend installed; a process alone gets its own)::

    evaluator = CocoEvaluator("instances_val.json")
    for batch in shard:
        evaluator.add_batch(image_ids, boxes, scores, labels)
    shares = gather_objects((evaluator.detections, evaluator.image_ids))   # every process's, in rank order
    evaluator.reset()
    for detections, image_ids in shares:
        evaluator.add(detections, image_ids)   # images already added are skipped
    metrics = evaluator.compute()               # {"val/map": ..., "val/map50": ...}
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster

from hydrali.tasks.detection.coco import load_coco_json
from hydrali.tasks.detection.layout import BOX_VALUES, FIRST_OBJECT_LABEL

MAP_KEY = "val/map"
MAP50_KEY = "val/map50"
# faster-coco-eval's names for COCO's first two summary numbers (maxDets=100, area "all")
MAP_STAT = "AP_all"
MAP50_STAT = "AP_50"
# COCOeval reports -1 where a value is undefined (no ground truth to recall): reported as 0.0
UNDEFINED_STAT = -1.0
NO_SCORE = 0.0

IOU_TYPE = "bbox"
GROUND_TRUTH_KEYS = ("images", "annotations", "categories")


def _silent(*args: Any, **kwargs: Any) -> None:
    """Swallow faster-coco-eval's progress messages."""


def load_ground_truth(source: str | os.PathLike | Mapping) -> dict:
    """The COCO ground truth as a dict (a deep copy when given a dict), checked for its three lists."""
    if not isinstance(source, Mapping):
        return load_coco_json(Path(source))  # a file: the dataset checks' loader, one-line errors
    data = copy.deepcopy(dict(source))
    missing = [key for key in GROUND_TRUTH_KEYS if not isinstance(data.get(key), list)]
    if missing:
        raise ValueError(f"COCO annotations in the ground-truth dict lack the list(s) {', '.join(missing)}")
    return data


def category_ids_of(ground_truth: Mapping) -> list[int]:
    """The file's category ids in the order DALI's COCO reader numbers them: label k is item k - 1."""
    return [int(category["id"]) for category in ground_truth["categories"]]


def image_sizes_of(ground_truth: Mapping) -> dict[int, tuple[int, int]]:
    """(height, width) of each image of the ground truth that states both, by image id."""
    return {
        int(image["id"]): (int(image["height"]), int(image["width"]))
        for image in ground_truth["images"]
        if "height" in image and "width" in image
    }


def _rows(array: Any, count: int | None, columns: int | None = None) -> np.ndarray:
    """The first `count` rows (all when None) of one image's output, as float64."""
    rows = np.asarray(array, dtype=np.float64)
    if columns is not None:
        rows = rows.reshape(-1, columns) if rows.size == 0 else rows
        if rows.ndim != 2 or rows.shape[1] != columns:
            raise ValueError(f"boxes must have shape (detections, {columns}), got {rows.shape}")
    else:
        rows = rows.reshape(-1)
    return rows if count is None else rows[: int(count)]


def _pixel_xywh(boxes: np.ndarray, height: float, width: float) -> np.ndarray:
    """Normalized ltrb boxes -> [x, y, w, h] in pixels of an image of that size, clipped to it."""
    scale = np.array([width, height, width, height], dtype=np.float64)
    ltrb = np.clip(boxes * scale, 0.0, scale)
    return np.concatenate([ltrb[:, :2], ltrb[:, 2:] - ltrb[:, :2]], axis=1)


def _file_category_ids(labels: np.ndarray, category_ids: Sequence[int]) -> np.ndarray:
    """Contiguous labels 1..K -> the file's category ids; a label above K is an error."""
    labels = np.rint(labels).astype(np.int64)
    too_high = labels[labels > len(category_ids)]
    if too_high.size:
        raise ValueError(
            f"label {int(too_high[0])} is above the {len(category_ids)} categories "
            f"of the annotation file (labels run 1..{len(category_ids)}, 0 = background)"
        )
    return np.asarray(category_ids, dtype=np.int64)[labels - FIRST_OBJECT_LABEL]


def image_detections(
    image_id: int,
    boxes: Any,
    scores: Any,
    labels: Any,
    image_size: tuple[int, int],
    category_ids: Sequence[int],
    count: int | None = None,
) -> list[dict]:
    """COCO result dicts for one image; see :func:`to_coco_detections` for the arguments."""
    boxes = _rows(boxes, count, BOX_VALUES)
    scores, labels = _rows(scores, count), _rows(labels, count)
    if not len(boxes) == len(scores) == len(labels):
        raise ValueError(f"image {image_id}: {len(boxes)} boxes, {len(scores)} scores, {len(labels)} labels")
    xywh = _pixel_xywh(boxes, *image_size)
    # labels below the first object's are not objects: background, or padding of fixed-size outputs (-1 in
    # keras-hub); NaN compares False, so a NaN box or score is dropped here too
    keep = (np.rint(labels) >= FIRST_OBJECT_LABEL) & (xywh[:, 2] > 0) & (xywh[:, 3] > 0) & np.isfinite(scores)
    category = _file_category_ids(labels[keep], category_ids)
    return [
        {"image_id": int(image_id), "category_id": int(cat), "bbox": box, "score": score}
        for cat, box, score in zip(category.tolist(), xywh[keep].tolist(), scores[keep].tolist())
    ]


def _check_one_per_image(image_ids: Sequence[int], *per_image: Sequence[Any] | None) -> None:
    """Refuses per-image arguments (None: not given) whose length differs from image_ids'."""
    lengths = {len(values) for values in per_image if values is not None}
    if lengths - {len(image_ids)}:
        raise ValueError(
            f"{len(image_ids)} image ids, but per-image arguments of lengths {sorted(lengths)}: "
            "boxes, scores, labels, image_sizes and counts need one item per image"
        )


def _select(values: Sequence[Any] | None, positions: Sequence[int]) -> list[Any] | None:
    """The items of values at those positions (None stays None)."""
    return None if values is None else [values[position] for position in positions]


def to_coco_detections(
    image_ids: Sequence[int],
    boxes: Sequence[Any],
    scores: Sequence[Any],
    labels: Sequence[Any],
    image_sizes: Sequence[tuple[int, int]],
    category_ids: Sequence[int],
    counts: Sequence[int] | None = None,
) -> list[dict]:
    """A batch of model outputs as COCO result dicts, in the file's category ids and original pixels.

    One item per image in every sequence (lists of per-image arrays, or padded arrays whose
    first axis is the image):
      image_ids: the file's image ids (DALI's ``fn.readers.coco(image_ids=True)``);
      boxes: (M, 4) ltrb normalized to [0, 1]; scores: (M,); labels: (M,) contiguous 1..K,
        0 background, negative values padding;
      image_sizes: (height, width) of the ORIGINAL image, in pixels;
      category_ids: the file's id of each label, ``category_ids[label - 1]``
        (:func:`category_ids_of` gives DALI's numbering);
      counts: with padded arrays, how many rows of each image are real (None: all rows).
    Returns dicts {"image_id", "category_id", "bbox": [x, y, w, h], "score"} of plain Python
    numbers (JSON- and pickle-ready), boxes clipped to the image; background, padding,
    empty boxes and non-finite scores are left out.
    """
    _check_one_per_image(image_ids, boxes, scores, labels, image_sizes, counts)
    per_image_counts = counts if counts is not None else [None] * len(image_ids)
    detections: list[dict] = []
    for args in zip(image_ids, boxes, scores, labels, image_sizes, per_image_counts):
        image_id, image_boxes, image_scores, image_labels, size, count = args
        detections += image_detections(image_id, image_boxes, image_scores, image_labels, size, category_ids, count)
    return detections


def coco_map(ground_truth: COCO, detections: list[dict], image_ids: Iterable[int] | None = None) -> dict[str, float]:
    """{"val/map": mAP@[.5:.95], "val/map50": mAP@.5} of the detections, as pycocotools computes them.

    ground_truth: the ground truth as faster-coco-eval's ``COCO``; image_ids: the images to
    score (None: all the ground truth's images). Undefined values (nothing to score) are 0.0;
    nothing is printed.
    """
    scored = sorted(ground_truth.getImgIds()) if image_ids is None else sorted(set(image_ids))
    if not scored:
        return {MAP_KEY: NO_SCORE, MAP50_KEY: NO_SCORE}
    results = ground_truth.loadRes([dict(detection) for detection in detections])  # loadRes edits its dicts
    evaluation = COCOeval_faster(ground_truth, results, iouType=IOU_TYPE, print_function=_silent)
    evaluation.params.imgIds = scored
    evaluation.run()
    stats = evaluation.stats_as_dict
    return {MAP_KEY: _defined(stats[MAP_STAT]), MAP50_KEY: _defined(stats[MAP50_STAT])}


def _defined(value: float) -> float:
    """A COCO summary number, with COCOeval's 'undefined' (-1) as 0.0."""
    return NO_SCORE if value <= UNDEFINED_STAT else float(value)


class CocoEvaluator:
    """Holds a COCO ground truth, collects detections (from batches or other processes) and scores them."""

    def __init__(self, ground_truth: str | os.PathLike | Mapping, *, seen_images_only: bool = False):
        """ground_truth: a COCO annotation file or its loaded dict (not modified).

        seen_images_only: score only the images added (with or without detections) instead
        of every image of the file, e.g. when validation runs on part of the set.
        """
        data = load_ground_truth(ground_truth)
        self._category_ids = category_ids_of(data)
        self._image_sizes = image_sizes_of(data)
        self._known_images = {int(image["id"]) for image in data["images"]}
        self._known_categories = set(self._category_ids)
        self._coco = COCO(data, print_function=_silent)
        self._seen_images_only = seen_images_only
        self.reset()

    @property
    def category_ids(self) -> list[int]:
        """The file's category id of each contiguous label: label k is item k - 1."""
        return list(self._category_ids)

    @property
    def detections(self) -> list[dict]:
        """The detections collected so far, COCO result dicts (a list to gather across processes)."""
        return self._detections

    @property
    def image_ids(self) -> list[int]:
        """The images added so far, with or without detections, sorted."""
        return sorted(self._seen)

    def reset(self) -> None:
        """Forget the detections and images added (e.g. at the start of a validation epoch)."""
        self._detections: list[dict] = []
        self._seen: set[int] = set()

    def add_batch(
        self,
        image_ids: Sequence[int],
        boxes: Sequence[Any],
        scores: Sequence[Any],
        labels: Sequence[Any],
        image_sizes: Sequence[tuple[int, int]] | None = None,
        counts: Sequence[int] | None = None,
    ) -> None:
        """Adds a batch of model outputs (arguments as in :func:`to_coco_detections`).

        image_sizes: (height, width) of the original images; None takes them from the
        annotation file, as DALI does when it normalizes boxes. Images already added (DALI
        repeats samples to pad a shard's last batch) are skipped.
        """
        image_ids = [int(image_id) for image_id in image_ids]
        _check_one_per_image(image_ids, boxes, scores, labels, image_sizes, counts)
        self._check_images(image_ids)
        sizes = self._sizes_of(image_ids) if image_sizes is None else image_sizes
        fresh = self._first_occurrences(image_ids)
        self._detections += to_coco_detections(
            _select(image_ids, fresh),
            _select(boxes, fresh),
            _select(scores, fresh),
            _select(labels, fresh),
            _select(sizes, fresh),
            self._category_ids,
            _select(counts, fresh),
        )
        self._seen.update(image_ids)

    def add(self, detections: Iterable[Mapping], image_ids: Iterable[int] | None = None) -> None:
        """Adds COCO result dicts (e.g. gathered from another process) in the file's ids and pixels.

        image_ids: the images these detections cover, those without detections included
        (None: the images the detections name). Detections of images already added are skipped,
        so adding every process's gathered share, this one's included, counts each image once.
        """
        detections = [dict(detection) for detection in detections]
        named = {int(d["image_id"]) for d in detections}
        covered = named if image_ids is None else {int(image_id) for image_id in image_ids}
        if named - covered:
            raise ValueError(f"detections name image id(s) {sorted(named - covered)[:5]} missing from image_ids")
        self._check_images(covered)
        self._check_categories(detections)
        fresh = covered - self._seen
        self._detections += [d for d in detections if int(d["image_id"]) in fresh]
        self._seen |= covered

    def compute(self) -> dict[str, float]:
        """{"val/map": mAP@[.5:.95], "val/map50": mAP@.5} of what was added (0.0 when nothing was)."""
        scored = self._seen if self._seen_images_only else None
        return coco_map(self._coco, self._detections, scored)

    def _first_occurrences(self, image_ids: Sequence[int]) -> list[int]:
        """Positions in the batch of images not added before and not repeated earlier in the batch."""
        seen, fresh = set(self._seen), []
        for position, image_id in enumerate(image_ids):
            if image_id not in seen:
                seen.add(image_id)
                fresh.append(position)
        return fresh

    def _sizes_of(self, image_ids: Sequence[int]) -> list[tuple[int, int]]:
        """(height, width) of each image, from the annotation file."""
        missing = [image_id for image_id in image_ids if image_id not in self._image_sizes]
        if missing:
            raise ValueError(
                f"the annotation file gives no width/height for image id(s) {missing[:5]}: "
                f"pass image_sizes to add_batch"
            )
        return [self._image_sizes[image_id] for image_id in image_ids]

    def _check_images(self, image_ids: Iterable[int]) -> None:
        """Refuses image ids that the annotation file does not list."""
        unknown = sorted(set(image_ids) - self._known_images)
        if unknown:
            raise ValueError(f"image id(s) {unknown[:5]} are not in the annotation file's images")

    def _check_categories(self, detections: Iterable[Mapping]) -> None:
        """Refuses category ids that the annotation file does not list (a label mapped wrongly)."""
        unknown = sorted({int(d["category_id"]) for d in detections} - self._known_categories)
        if unknown:
            raise ValueError(
                f"category id(s) {unknown[:5]} are not in the annotation file's categories "
                f"{self._category_ids}: were contiguous labels mapped back?"
            )


def per_category_ap(ground_truth: COCO, detections: list[dict], image_ids: Iterable[int]) -> dict[int, dict]:
    """For each category id of the ground truth: its AP@[.5:.95] and AP@.5 over `image_ids` (area all, 100
    detections), from COCOeval's precision table as pycocotools' summary averages it; None where no ground truth of
    the category exists in those images (0.0 for every category when there are no detections at all)."""
    results = ground_truth.loadRes([dict(detection) for detection in detections]) if detections else None
    if results is None:
        return {int(c): {"ap": 0.0, "ap50": 0.0} for c in ground_truth.getCatIds()}
    evaluation = COCOeval_faster(ground_truth, results, iouType=IOU_TYPE, print_function=_silent)
    evaluation.params.imgIds = sorted(set(image_ids))
    evaluation.run()
    precision = np.asarray(evaluation.eval["precision"])  # [iou thresholds, recalls, categories, areas, max dets]
    found = {}
    for k, category in enumerate(evaluation.params.catIds):
        table = precision[:, :, k, 0, -1]
        defined = table[table > UNDEFINED_STAT]
        at_50 = table[0][table[0] > UNDEFINED_STAT]
        found[int(category)] = {
            "ap": float(defined.mean()) if defined.size else None,
            "ap50": float(at_50.mean()) if at_50.size else None,
        }
    return found
