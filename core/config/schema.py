"""Structured-config schemas: Hydra checks every composed config against these before any work.

An unknown key or a value of the wrong type fails at composition time, naming the key. Each
group's options pull their schema through their defaults list; the primary config pulls
`hydrali_schema` for the top-level keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from hydrali.core.data.image_files import Verify
from hydrali.core.optim.optimizer import PRECISIONS


class Choice(str, Enum):
    """A closed set of string values; composition fails, listing them, on any other value."""

    def __str__(self) -> str:
        return self.value


class Mode(Choice):
    """Whether a larger monitored metric is better."""
    max = "max"
    min = "min"


class Device(Choice):
    """Where DALI runs: auto, cpu or gpu."""
    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"


class LastBatch(Choice):
    """What happens to an epoch's last, partial training batch (see hydrali.core.run.epoch)."""
    drop = "drop"
    fill = "fill"


# Numeric precision of training, the same names on every backend (see hydrali.core.optim.optimizer). Built with
# the functional API: the names (what a user types) are not Python identifiers.
Precision = Choice("Precision", {name: name for name in PRECISIONS})


class Dtype(Choice):
    """The type of the images a recipe outputs."""
    float = "float"
    float16 = "float16"


class CompileMode(Choice):
    """torch.compile's modes (backend=lightning, backend.compile=true)."""
    default = "default"
    reduce_overhead = "reduce-overhead"
    max_autotune = "max-autotune"


class Optimizer(Choice):
    """The optimizers both backends build."""
    sgd = "sgd"
    adamw = "adamw"


class Scale(Choice):
    """How the lr follows the global batch."""
    linear = "linear"
    sqrt = "sqrt"
    none = "none"


class Schedule(Choice):
    """The lr schedule after warmup."""
    cosine = "cosine"
    constant = "constant"


@dataclass
class TaskConfig:
    """conf/task/classification.yaml: what is learned and which metric picks the best checkpoint."""

    name: str = MISSING
    _target_: str = MISSING
    torch_target: str = MISSING
    keras_target: str = MISSING
    monitor: str = MISSING
    mode: Mode = Mode.max
    label_smoothing: float = 0.0


class DetectionLoss(Choice):
    """The detection task's classification loss (both with smooth-L1 on the boxes of positive anchors)."""
    hard_negatives = "hard_negatives"
    focal = "focal"


@dataclass
class DetectionTaskConfig:
    """conf/task/detection.yaml: the detector's loss, its decoding into detections, and the pictures drawn."""

    name: str = MISSING
    _target_: str = MISSING
    torch_target: str = MISSING
    keras_target: str = MISSING
    monitor: str = MISSING
    mode: Mode = Mode.max
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
class PipelineConfig:
    """conf/pipeline/*.yaml: a DALI recipe and its knobs (documented in the YAML files)."""

    name: str = MISSING
    task: str = MISSING
    recipe: str = MISSING
    device: Device = Device.auto
    num_threads: int = 2
    hw_decoder_load: float = 0.65
    prefetch_queue_depth: int = 2
    train_last_batch: LastBatch = LastBatch.drop
    dtype: Dtype = Dtype.float
    options: Dict[str, Any] = field(default_factory=dict)
    autotune: bool = False                     # probe num_threads (and hw_decoder_load on a GPU) before training
    autotune_threads: List[int] = field(default_factory=list)   # num_threads candidates; empty: automatic
    autotune_loads: List[float] = field(default_factory=lambda: [0.5, 0.8, 1.0])   # hw_decoder_load candidates
    autotune_warmup: int = 3                   # batches run before timing (at least prefetch_queue_depth + 1)
    autotune_batches: int = 10                 # batches timed per candidate


@dataclass
class DataConfig:
    """conf/data/*.yaml: where the dataset is and how it is batched."""

    name: str = MISSING
    root: str = MISSING
    batch_size: int = 64
    image_size: int = 224
    num_classes: Optional[int] = None
    val_fraction: float = 0.0
    size: int = 0
    verify: Verify = Verify.quick


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
    image_size: int = 128
    num_classes: Optional[int] = None
    train_dir: str = "train2017"
    val_dir: str = "val2017"
    annotations_dir: str = "annotations"
    train_annotations: Optional[str] = None
    val_annotations: Optional[str] = None
    clean_dir: str = MISSING
    verify: Verify = Verify.quick
    generate: Optional[DigitsDetectionConfig] = None


@dataclass
class OptimConfig:
    """conf/optim/*.yaml: optimizer, base lr and the rule that scales it."""

    name: Optimizer = Optimizer.sgd
    lr: float = 0.1
    ref_batch: int = 256
    scale: Scale = Scale.linear
    warmup_epochs: float = 0.0
    warmup_div: float = 10.0
    schedule: Schedule = Schedule.cosine
    weight_decay: float = 0.0
    momentum: float = 0.9
    nesterov: bool = False
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class TrackingConfig:
    """conf/tracking/*.yaml: the MLflow store and experiment."""

    enabled: bool = True
    uri: Optional[str] = None
    experiment: str = "hydrali"
    artifact_location: Optional[str] = None
    log_checkpoint: bool = True
    ui_host: str = "127.0.0.1"
    ui_port: int = 5000


@dataclass
class PathsConfig:
    """conf/paths/*.yaml: where data, outputs and the MLflow store live."""

    root: str = MISSING
    data_dir: str = MISSING
    output_dir: str = MISSING


@dataclass
class LightningBackendConfig:
    """conf/backend/lightning.yaml: devices, nodes, strategy and Trainer options."""

    name: str = "lightning"
    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: Precision = Precision["32-true"]
    channels_last: bool = False
    compile: bool = False
    compile_mode: CompileMode = CompileMode.default
    compile_fullgraph: bool = False
    compile_dynamic: Optional[bool] = None
    save_top_k: int = 1
    callbacks: Dict[str, Any] = field(default_factory=dict)
    trainer: Dict[str, Any] = field(default_factory=dict)


@dataclass
class KerasBackendConfig:
    """conf/backend/keras.yaml: replicas and Keras fit options."""

    name: str = "keras"
    replicas: Optional[int] = None
    precision: Precision = Precision["32-true"]
    validation_freq: int = 1
    verbose: Any = "auto"
    compile: bool = False
    keep_checkpoints: int = 3
    callbacks: Dict[str, Any] = field(default_factory=dict)


@dataclass
class HydraliConfig:
    """The top level. Groups are typed Any here: each option brings its own schema.

    `model` has none on purpose: any `_target_` with any arguments may build the network.
    """
    task: Any = MISSING
    pipeline: Any = MISSING
    data: Any = MISSING
    model: Any = MISSING
    backend: Any = MISSING
    optim: Any = MISSING
    tracking: Any = MISSING
    paths: Any = MISSING
    seed: Optional[int] = 42
    deterministic: bool = False
    epochs: int = 10
    throughput_warmup_steps: int = 5
    ckpt_path: Optional[str] = None
    optimized_metric: str = "val/acc"


GROUP_SCHEMAS = {
    "pipeline": PipelineConfig,
    "optim": OptimConfig,
    "tracking": TrackingConfig,
    "paths": PathsConfig,
}
BACKEND_SCHEMAS = {"lightning": LightningBackendConfig, "keras": KerasBackendConfig}
# each task's schemas of its `task` and `data` nodes
TASK_SCHEMAS = {"classification": {"task": TaskConfig, "data": DataConfig},
                "detection": {"task": DetectionTaskConfig, "data": DetectionDataConfig}}


def register_schemas() -> None:
    """Register every schema in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="hydrali_schema", node=HydraliConfig)
    for group, node in GROUP_SCHEMAS.items():
        cs.store(name=f"{group}_schema", node=node)
    for name, node in BACKEND_SCHEMAS.items():
        cs.store(name=f"{name}_backend_schema", node=node)
    cs.store(name="task_schema", node=TaskConfig)
    cs.store(name="data_schema", node=DataConfig)
    cs.store(name="detection_task_schema", node=DetectionTaskConfig)
    cs.store(name="detection_data_schema", node=DetectionDataConfig)
