"""Detection scored outside any framework (hydrali eval and predict): the padded detections a backend's trained
network returns (boxes ltrb in [0, 1], scores, labels 1..K, counts), turned into COCO mAP with per-category AP
(faster-coco-eval), or written as COCO results (predictions.json) with the images they name (images.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hydrali.tasks.detection.coco import CocoSplit, load_coco_json
from hydrali.tasks.detection.evaluation import CocoEvaluator, per_category_ap

PREDICTIONS_FILE = "predictions.json"  # COCO results: image_id, category_id, bbox [x, y, w, h] in pixels, score
IMAGES_FILE = "images.json"  # the COCO file of the images predicted (ids, file names, sizes, categories)


def _add(evaluator: CocoEvaluator, predictions: dict, batch: dict) -> None:
    evaluator.add_batch(
        np.asarray(batch["image_ids"]).reshape(-1).astype(np.int64).tolist(),
        predictions["boxes"],
        predictions["scores"],
        np.asarray(predictions["labels"]).astype(np.int64),
        counts=np.asarray(predictions["counts"]).astype(np.int64).tolist(),
    )


class DetectionScores:
    """Accumulates the detections of every image of a split, then scores them against its annotation file."""

    def __init__(self, split: CocoSplit):
        self.split = split
        self.evaluator = CocoEvaluator(split.annotation_file)
        self.names = dict(zip(split.category_ids, split.category_names))

    def update(self, predictions: dict, batch: dict) -> None:
        """Add a batch: the network's padded detections and the recipe's image ids."""
        _add(self.evaluator, predictions, batch)

    @property
    def images(self) -> int:
        """The number of images scored."""
        return len(self.evaluator.image_ids)

    def metrics(self) -> dict[str, float]:
        """The task's metrics (map: COCO mAP@[.5:.95], map50: mAP@.5), named as in training."""
        return {name.split("/", 1)[1]: value for name, value in self.evaluator.compute().items()}

    def per_class(self) -> dict[str, dict]:
        """For each category (by name): its AP, AP@.5 and number of ground-truth boxes."""
        coco = self.evaluator._coco
        table = per_category_ap(coco, self.evaluator.detections, self.evaluator.image_ids)
        boxes = {c: len(coco.getAnnIds(catIds=[c], imgIds=self.evaluator.image_ids)) for c in table}
        return {self.names.get(c, str(c)): {**row, "support": boxes[c]} for c, row in table.items()}

    def report(self) -> dict:
        """What metrics.json holds besides the metrics: per-category AP."""
        return {"classes": list(self.names.values()), "per_class": self.per_class()}

    def per_class_table(self) -> list[str]:
        """The per-category figures as text lines, for the terminal."""
        rows = self.per_class()
        width = max(len("category"), *(len(n) for n in rows))

        def shown(value):
            return "   n/a" if value is None else f"{value:.4f}"

        lines = [f"{'category':<{width}}      AP    AP50   boxes"]
        for name, row in rows.items():
            lines.append(f"{name:<{width}}  {shown(row['ap'])}  {shown(row['ap50'])}  {row['support']:>6d}")
        return lines

    def write_pictures(self, folder: Path) -> list[Path]:
        """No picture (training's validation pictures show detections)."""
        return []


class DetectionPredictions:
    """Collects the detections of the images predicted and writes them as COCO results."""

    def __init__(self, split: CocoSplit):
        self.split = split
        self.evaluator = CocoEvaluator(split.annotation_file)

    def update(self, files: list[str], predictions: dict, batch: dict) -> None:
        """Add a batch: the network's padded detections for the images the recipe's image ids name."""
        _add(self.evaluator, predictions, batch)

    def write(self, folder: Path) -> list[Path]:
        """predictions.json (COCO results, the annotation file's image and category ids, pixels of the original
        images) and images.json (the images those ids name) in `folder`."""
        path = folder / PREDICTIONS_FILE
        path.write_text(json.dumps(self.evaluator.detections) + "\n")
        (folder / IMAGES_FILE).write_text(json.dumps(load_coco_json(self.split.annotation_file)) + "\n")
        return [path, folder / IMAGES_FILE]
