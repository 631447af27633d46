"""The detection task, framework-neutral: its data, its DALI pipelines, its outputs and its validation.

Framework code lives beside it in torch_*.py and keras_*.py, named by the task's config (`task.sides`) and
imported only by the backend that uses it.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from omegaconf import DictConfig, OmegaConf

from hydrali.core.data import webdataset
from hydrali.core.data.image_files import Verify
from hydrali.core.errors import HydraliError
from hydrali.core.run.plan import Plan, Shard
from hydrali.tasks.base import DaliTask
from hydrali.tasks.detection import sharded
from hydrali.tasks.detection.anchors import anchor_spec, default_boxes
from hydrali.tasks.detection.coco import CocoInfo, default_annotations, images_only_coco, scan_coco, scan_coco_split
from hydrali.tasks.detection.digits import write_digits_detection
from hydrali.tasks.detection.layout import IMAGE_ID_COLUMNS, TARGET_COLUMNS, TRAINING_OUTPUTS, VALIDATION_OUTPUTS
from hydrali.tasks.detection.recipes import CocoSource
from hydrali.tasks.detection.scoring import DetectionPredictions, DetectionScores
from hydrali.tasks.detection.spec import CLASS_LOSS_SETTINGS, DECODING_SETTINGS
from hydrali.tasks.detection.validation import DetectionValidation


@dataclass(kw_only=True)
class DetectionTask(DaliTask):
    """Single-stage object detection on a COCO-layout dataset; SSD losses; COCO mAP. Its settings come from the
    config (their defaults and comments: conf/task/detection.yaml, its schema: tasks/detection/spec.py)."""

    loss: str
    neg_pos_ratio: float
    focal_alpha: float
    focal_gamma: float
    score_threshold: float
    iou_threshold: float
    pre_nms_top_k: int
    max_detections: int
    pictures: int
    pictures_dir: str
    shard_reading: ClassVar[str] = "task=detection data=webdataset_detection"  # what trains from its shards

    def output_names(self, is_training: bool) -> tuple[str, ...]:
        """What the recipes return, in order: validation adds each image's id."""
        return TRAINING_OUTPUTS if is_training else VALIDATION_OUTPUTS

    def output_specs(
        self, *, batch: int, image_size: int, image_dtype: str, is_training: bool, model: DictConfig
    ) -> tuple[tuple[tuple[int, ...], str], ...]:
        """(shape, dtype) of each batched output in HWC layout, for frameworks that need them up front (Keras)."""
        anchors = len(self.anchors(model, image_size))
        specs = [((batch, image_size, image_size, 3), image_dtype), ((batch, anchors, TARGET_COLUMNS), "float")]
        if not is_training:
            specs.append(((batch, IMAGE_ID_COLUMNS), "int32"))
        return tuple(specs)

    @staticmethod
    def anchors(model: DictConfig, image_size: int):
        """[N, 4] ltrb anchors of the model's `anchors` settings at this image size (what the encoder and heads use)."""
        try:
            return default_boxes(anchor_spec(image_size, OmegaConf.to_container(model.anchors, resolve=True)))
        except (ValueError, KeyError) as err:
            raise HydraliError(f"model.anchors does not fit data.image_size={image_size}: {err}") from err

    def prepare_data(self, data: DictConfig, verify: Verify) -> CocoInfo:
        """Make sure the dataset is on disk (writing the bundled one if needed), check its annotation files
        (fixing what can be fixed in cleaned copies) and, as `verify` says, its image files. Shards
        (data=webdataset_detection) are read from their manifest, their files checked to exist."""
        if data.name == webdataset.FORMAT:
            info = sharded.open_shards(str(data.root), Path(data.clean_dir))
            self.check_prepared(data, info, Verify.off, classes_in=f"{data.root}/{webdataset.MANIFEST}")
            return info
        if data.generate is not None:
            write_digits_detection(
                data.root,
                **OmegaConf.to_container(data.generate, resolve=True),
                train_dir=data.train_dir,
                val_dir=data.val_dir,
                annotations_dir=data.annotations_dir,
            )
        info = scan_coco(
            data.root,
            train_dir=data.train_dir,
            val_dir=data.val_dir,
            clean_dir=data.clean_dir,
            train_annotations=data.train_annotations or default_annotations(data.train_dir, data.annotations_dir),
            val_annotations=data.val_annotations or default_annotations(data.val_dir, data.annotations_dir),
        )
        bad = self.check_prepared(data, info, verify, classes_in=f"{info.train.annotation_file} (categories)")
        return info.without(bad, data.clean_dir) if bad else info

    def image_files(self, dataset: CocoInfo) -> list[Path]:
        """Every image file of the train and val image folders; none for shards."""
        if isinstance(dataset, sharded.ShardedDetection):
            return []
        return sorted(p for split in (dataset.train, dataset.val) for p in split.images_dir.iterdir() if p.is_file())

    def source(self, dataset: CocoInfo, shard: Shard, plan: Plan, is_training: bool) -> CocoSource:
        """The split's images and annotation file, this replica's shard of them."""
        split = dataset.train if is_training else dataset.val
        return CocoSource(
            str(split.images_dir),
            shard.shard_id,
            plan.num_shards,
            is_training,
            annotation_file=str(split.annotation_file),
        )

    def recipe_arguments(self, model: DictConfig, data: DictConfig) -> dict:
        """The model's anchors at the data's image size (the box encoder's)."""
        return {"anchors": self.anchors(model, data.image_size)}

    def validation(self, dataset: CocoInfo) -> DetectionValidation:
        """A fresh scorer of validation detections (COCO mAP against the val annotation file), which also
        draws the pictures (from the image files: none for shards)."""
        pictures = 0 if isinstance(dataset, sharded.ShardedDetection) else self.pictures
        return DetectionValidation(dataset.val, pictures=pictures, pictures_dir=Path(self.pictures_dir))

    def detection_args(self) -> dict:
        """How raw outputs become detections, the same on every backend (score and IoU thresholds, top-k, cap)."""
        return {name: getattr(self, name) for name in DECODING_SETTINGS}

    def postprocessing(self) -> dict:
        """What a serving stack does after an exported detector (preprocessing.json of hydrali export): the
        decoding's per-class NMS, with the run's settings."""
        return {
            "not_in_the_model": "per-class non-maximum suppression, as hydrali decodes: the pre_nms_top_k best "
            "(anchor, class) pairs of an image by probability (classes 1..K), those above score_threshold, greedy "
            "NMS per class at iou_threshold, the max_detections best kept",
            "outputs": "boxes [B, N, 4] ltrb in [0, 1] of the resized image; scores [B, N, 1 + K], index 0 background",
            **self.detection_args(),
        }

    def loss_args(self) -> dict:
        """The multibox loss's settings, the same on every backend."""
        return {"kind": self.loss, **{name: getattr(self, name) for name in CLASS_LOSS_SETTINGS}}

    def evaluation_data(self, data: DictConfig, split: str, verify: Verify) -> CocoInfo:
        """The dataset scored by hydrali eval: its val split (another set of images is scored by naming it the val
        split: data.val_dir and data.val_annotations)."""
        if split != "val":
            raise HydraliError(
                f"split={split}: task=detection scores the val split; to score other images pass "
                f"data.val_dir=<their folder> data.val_annotations=<their COCO annotation file>"
            )
        return self.prepare_data(data, verify)

    def prediction_data(
        self, dataset: CocoInfo, folder: Path, files: list[str], annotations: str | None = None
    ) -> CocoInfo:
        """A dataset whose val split is the images of `folder` read by hydrali predict: those `annotations` (a COCO
        file naming them, whose image ids the predictions take) describes, or else `files` (relative to `folder`),
        numbered 1.. in their order, in a COCO file of their sizes written to a temporary folder."""
        scratch = Path(tempfile.mkdtemp(prefix="hydrali-predict-"))
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        if annotations is None:
            annotations = scratch / "images.json"
            annotations.write_text(json.dumps(images_only_coco(folder, files, dataset.val.annotation_file)))
        split = scan_coco_split(folder, Path(annotations), scratch / "cleaned.json")
        if (split.category_ids, split.category_names) != (dataset.category_ids, dataset.category_names):
            raise HydraliError(f"annotations={annotations} has other categories than the run's training set")
        if isinstance(dataset, sharded.ShardedDetection):  # the folder's images, read as a COCO set
            return CocoInfo(Path(folder), train=split, val=split)
        return replace(dataset, val=split, skipped=())

    def scores(self, dataset: CocoInfo) -> DetectionScores:
        """What hydrali eval accumulates over the val split's batches (tasks/detection/scoring.py)."""
        return DetectionScores(dataset.val)

    def predictions(self, dataset: CocoInfo, top_k: int) -> DetectionPredictions:
        """What hydrali predict accumulates and writes (predictions.json, COCO results); every detection is kept
        (up to task.max_detections per image): top_k is classification's."""
        return DetectionPredictions(dataset.val)

    def shard_samples(self, dataset: CocoInfo, split: str, seed: int | None):
        """(how many, the samples) of `split` as hydrali convert writes them (tasks/detection/sharded.py)."""
        return sharded.samples(dataset, split, seed)

    def shard_facts(self, dataset: CocoInfo) -> dict:
        """What the shards' manifest records about the data: categories, the val annotation file, box counts."""
        return sharded.facts(dataset)

    def shard_files(self, dataset: CocoInfo) -> dict[str, bytes]:
        """The files written beside the tars: the val split's annotation file, scored against."""
        return sharded.files(dataset)

    def artifacts(self) -> list[tuple[Path, str]]:
        """Files the task wrote for the run's tracker: (path, artifact folder)."""
        folder = Path(self.pictures_dir)
        return [(p, "pictures") for p in sorted(folder.glob("*.png"))] if folder.is_dir() else []
