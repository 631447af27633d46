"""One validation of the detection task, framework-neutral: detections in, COCO mAP and pictures out.

Both backends' framework sides feed it numpy arrays batch by batch (each process its own shard), gather what
every process collected (`gather_across_processes`, through hydrali.core.distributed.gather) and call `finish`
once per validation: every process then scores the same detections, those of all images.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydrali.core.distributed.gather import AllGatherBytes, gather_objects
from hydrali.tasks.detection.coco import CocoSplit, load_coco_json
from hydrali.tasks.detection.evaluation import CocoEvaluator
from hydrali.tasks.detection.pictures import draw_predictions


class DetectionValidation:
    """Collects one validation's detections and scores them against the split's annotation file."""

    def __init__(self, split: CocoSplit, *, pictures: int, pictures_dir: Path):
        self.split = split
        self.evaluator = CocoEvaluator(split.annotation_file)
        self.pictures = pictures
        self.pictures_dir = Path(pictures_dir)

    def add_batch(
        self,
        image_ids: Sequence[int],
        boxes: Sequence[Any],
        scores: Sequence[Any],
        labels: Sequence[Any],
        counts: Sequence[int] | None = None,
    ) -> None:
        """Add one batch of detections (boxes ltrb in [0, 1] of the resized image, labels 1..K); images seen
        before (the shard's padding repeats images) are skipped."""
        self.evaluator.add_batch(image_ids, boxes, scores, labels, counts=counts)

    def collected(self) -> tuple[list[dict], list[int]]:
        """What this process collected, to share with the others: (COCO detections, image ids)."""
        return self.evaluator.detections, self.evaluator.image_ids

    def add_collected(self, shares: Sequence[tuple[list[dict], list[int]]]) -> None:
        """Add other processes' collected detections (images already added are skipped)."""
        for detections, image_ids in shares:
            self.evaluator.add(detections, image_ids)

    def gather_across_processes(self, all_gather_bytes: AllGatherBytes | None = None) -> None:
        """Hold every process's collected detections, in rank order (each image once), instead of this process's
        own: through `all_gather_bytes` (None: the collective the backend installed; none: this process alone).
        Every process of the job calls it at the same point."""
        shares = gather_objects(self.collected(), all_gather_bytes)
        if len(shares) > 1:  # a process alone holds its own already
            self.evaluator.reset()
            self.add_collected(shares)

    def finish(self, epoch: int, *, draw: bool) -> dict[str, float]:
        """{"val/map", "val/map50"} of what was added; with `draw` (one process of a run), this validation's
        pictures; then starts afresh."""
        metrics = self.evaluator.compute()
        if draw and self.pictures > 0:
            self._draw(epoch)
        self.evaluator.reset()
        return metrics

    def _draw(self, epoch: int) -> None:
        data = load_coco_json(self.split.annotation_file)
        names = {c["id"]: c["name"] for c in data["categories"]}
        shown = sorted(self.evaluator.image_ids)[: self.pictures]
        files = {image["id"]: image["file_name"] for image in data["images"]}
        truth, predicted = defaultdict(list), defaultdict(list)
        for a in data["annotations"]:
            truth[a["image_id"]].append((a["bbox"], names[a["category_id"]]))
        for d in self.evaluator.detections:
            predicted[d["image_id"]].append((d["bbox"], names[d["category_id"]], d["score"]))
        images = [
            {
                "file": self.split.images_dir / files[i],
                "truth": truth[i],
                "predictions": sorted(predicted[i], key=lambda p: -p[2]),
            }
            for i in shown
        ]
        draw_predictions(images, self.pictures_dir / f"val_epoch{epoch + 1:03d}.png", f"(epoch {epoch + 1})")
