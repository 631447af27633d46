"""task=detection as core sees it: the schemas of its `task` and `data` config nodes, and its registry entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from hydrali.core.config.schema import Choice, DataConfig, TaskConfig
from hydrali.core.contracts.task import TaskSpec


class DetectionLoss(Choice):
    """The detection task's classification loss (both with smooth-L1 on the boxes of positive anchors); each loss
    (torch_loss.CLASS_LOSSES, keras_loss.CLASS_LOSSES) keys its table by it."""

    hard_negatives = "hard_negatives"
    focal = "focal"


# The settings (task.*) that the class losses read, by the name every multibox loss's constructor takes them under
CLASS_LOSS_SETTINGS = ("neg_pos_ratio", "focal_alpha", "focal_gamma")
# The settings (task.*) that turn raw outputs into detections, by the name every backend's decoding takes them under
DECODING_SETTINGS = ("score_threshold", "iou_threshold", "pre_nms_top_k", "max_detections")


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
class DetectionDataConfig(DataConfig):
    """conf/data/{digits_detection,coco}.yaml: a COCO-layout dataset and how it is batched."""

    batch_size: int = 32
    image_size: int = 128
    train_dir: str = "train2017"
    val_dir: str = "val2017"
    annotations_dir: str = "annotations"
    train_annotations: Optional[str] = None
    val_annotations: Optional[str] = None
    clean_dir: str = MISSING
    generate: Optional[DigitsDetectionConfig] = None


SPEC = TaskSpec(name="detection", task_schema=DetectionTaskConfig, data_schema=DetectionDataConfig)
