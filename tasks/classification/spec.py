"""task=classification as core sees it: the schemas of its `task` and `data` config nodes, and its registry entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import MISSING

from hydrali.core.config.schema import TaskConfig
from hydrali.core.contracts.task import TaskSpec
from hydrali.core.data.image_files import BadFiles, Verify


@dataclass
class ClassificationTaskConfig(TaskConfig):
    """conf/task/classification.yaml: what is learned and which metric picks the best checkpoint."""

    label_smoothing: float = 0.0
    class_weights: Any = None  # null | auto | [one weight per class] (hydrali.core.optim.class_weights)
    flip_averaging: bool = False  # validation, eval and predict score the mean softmax of the images and their mirror


@dataclass
class ClassificationDataConfig:
    """conf/data/{digits,imagefolder}.yaml: where the dataset is and how it is batched."""

    name: str = MISSING
    root: str = MISSING
    batch_size: int = 64
    global_batch: Optional[int] = None  # images per optimizer step, fixed whatever the replicas (conf/data)
    image_size: Optional[int] = 224  # null: data=webdataset's, the shards' own (hydrali.core.data.shards_image_size)
    num_classes: Optional[int] = None
    val_fraction: float = 0.0
    size: int = 0
    verify: Verify = Verify.quick
    bad_files: BadFiles = BadFiles.fail


SPEC = TaskSpec(
    name="classification",
    task_schema=ClassificationTaskConfig,
    data_schema=ClassificationDataConfig,
    fine_tunes=True,
    trains_scaled_down=True,  # progressive_resizing: its batches are images and labels alone
)
