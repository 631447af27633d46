"""task=detection as core sees it: the schemas of its `task` and `data` config nodes, and its registry entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from hydrali.core.config.schema import Choice, TaskConfig
from hydrali.core.contracts.task import TaskSpec
from hydrali.core.data.image_files import BadFiles, Verify


class DetectionLoss(Choice):
    """The detection task's classification loss (both with smooth-L1 on the boxes of positive anchors); each loss
    (torch_loss.CLASS_LOSSES, keras_loss.CLASS_LOSSES) keys its table by it."""

    hard_negatives = "hard_negatives"
    focal = "focal"


@dataclass
class DetectionTaskConfig(TaskConfig):
    """conf/task/detection.yaml: the detector's loss, its decoding into detections, and the pictures drawn."""

    loss: DetectionLoss = DetectionLoss.hard_negatives
    neg_pos_ratio: float = 3.0
    focal_alpha: float = 0.25
    focal_gamma: float = 2.0
    score_threshold: float = 0.05
    iou_threshold: float = 0.5
    pre_nms_top_k: int = 200
    max_detections: int = 100
    pictures: int = 4
    pictures_dir: str = MISSING


@dataclass
class DigitsDetectionConfig:
    """conf/data/digits_detection.yaml `generate`: how the bundled detection digits are drawn."""

    num_train: int = 1000
    num_val: int = 200
    canvas: int = 128
    min_digits: int = 1
    max_digits: int = 5
    min_size: int = 16
    max_size: int = 48
    seed: int = 0


@dataclass
class DetectionDataConfig:
    """conf/data/{digits_detection,coco}.yaml: a COCO-layout dataset and how it is batched."""

    name: str = MISSING
    root: str = MISSING
    batch_size: int = 32
    global_batch: Optional[int] = None  # images per optimizer step, fixed whatever the replicas (conf/data)
    image_size: int = 128
    num_classes: Optional[int] = None
    train_dir: str = "train2017"
    val_dir: str = "val2017"
    annotations_dir: str = "annotations"
    train_annotations: Optional[str] = None
    val_annotations: Optional[str] = None
    clean_dir: str = MISSING
    verify: Verify = Verify.quick
    bad_files: BadFiles = BadFiles.fail
    generate: Optional[DigitsDetectionConfig] = None


SPEC = TaskSpec(name="detection", task_schema=DetectionTaskConfig, data_schema=DetectionDataConfig)
