"""task=classification as core sees it: the schemas of its `task` and `data` config nodes, and its registry entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hydrali.core.config.schema import DataConfig, TaskConfig
from hydrali.core.contracts.task import TaskSpec


@dataclass
class ClassificationTaskConfig(TaskConfig):
    """conf/task/classification.yaml: what is learned and which metric picks the best checkpoint."""

    label_smoothing: float = 0.0
    class_weights: Any = None  # null | auto | [one weight per class] (hydrali.core.optim.class_weights)
    flip_averaging: bool = False  # validation, eval and predict score the mean softmax of the images and their mirror


@dataclass
class ClassificationDataConfig(DataConfig):
    """conf/data/{digits,imagefolder}.yaml: where the dataset is and how it is batched."""

    batch_size: int = 64
    image_size: Optional[int] = 224  # null: data=webdataset's, the shards' own (hydrali.core.data.shards_image_size)
    val_fraction: float = 0.0
    size: int = 0


PACKAGE = "hydrali.tasks.classification"  # where the builders and their checks live

SPEC = TaskSpec(
    name="classification",
    task_schema=ClassificationTaskConfig,
    data_schema=ClassificationDataConfig,
    fine_tunes=True,
    trains_scaled_down=True,  # progressive_resizing: its batches are images and labels alone
    added_keys={"model.shortcut": "conv"},  # the ResNets' shortcut (ResNet-D's avgpool): strided 1x1 convs before it
    network_checks={  # each builder's layout check, framework-free: before the run dir is touched
        f"{PACKAGE}.{builder}": f"{PACKAGE}.layouts.{check}"
        for builder, check in (
            ("torch_model.ResNet", "check_resnet_config"),
            ("keras_model.ResNet", "check_resnet_config"),
            ("torch_model.ResNet9", "check_resnet9_config"),
            ("keras_model.ResNet9", "check_resnet9_config"),
            ("keras_model.ResNet50", "check_applications_resnet50_config"),  # keras.applications': no variants
        )
    },
)
