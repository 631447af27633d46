"""Structured-config schemas: Hydra checks every composed config against these before any work.

An unknown key or a value of the wrong type fails at composition time, naming the key. Each
group's options pull their schema through their defaults list; the primary config pulls
`hydrali_schema` for the top-level keys.

The `Choice` enums below are the only list of each closed set of values: the code that acts on a value (the lr
scale rules, the schedules, the last-batch policies, the DALI devices, the precisions) keys its tables by them,
and tests/test_choices.py checks that every table covers exactly its enum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from hydrali.core.data.image_files import BadFiles, Verify
from hydrali.core.errors import HydraliError


class Choice(str, Enum):
    """A closed set of string values; composition fails, listing them, on any other value."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, value: str, setting: str) -> "Choice":
        """The member whose value is `value` (a member or its string); any other value, as code called without
        the schema may receive, is an error naming `setting` and the choices."""
        try:
            return cls(value)
        except ValueError:
            raise HydraliError(f"{setting}={value!r}: choose one of {', '.join(cls.values())}") from None

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The values a user may type, in declaration order."""
        return tuple(member.value for member in cls)


class Mode(Choice):
    """Whether a larger monitored metric is better."""

    max = "max"
    min = "min"


class Device(Choice):
    """Where DALI runs: auto, cpu or gpu (resolved by hydrali.core.data.devices.resolve_device)."""

    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"


class WorkerCores(Choice):
    """Which cores DALI's worker threads may use (hydrali.core.data.affinity): auto, spare or any."""

    auto = "auto"
    spare = "spare"
    any = "any"


class AutotuneBy(Choice):
    """What pipeline.autotune times its candidates by (hydrali.core.data.autotune): training or decode."""

    training = "training"
    decode = "decode"


class LastBatch(Choice):
    """What happens to an epoch's last, partial training batch (hydrali.core.run.epoch.TRAIN_STEPS)."""

    drop = "drop"
    fill = "fill"


# Numeric precision of training, the same names on every backend (see hydrali.core.optim.optimizer): Lightning's
# names. Built with the functional API: the names (what a user types) are not Python identifiers.
Precision = Choice("Precision", {name: name for name in ("32-true", "bf16-mixed", "16-mixed")})


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
    """How the lr follows the global batch (hydrali.core.run.plan.SCALE_RULES)."""

    linear = "linear"
    sqrt = "sqrt"
    none = "none"


class WeightDecayOn(Choice):
    """The parameters optim.weight_decay applies to (hydrali.core.optim.optimizer.decays)."""

    kernels = "kernels"  # convolution and dense kernels (two or more dimensions): not biases or normalization
    all = "all"  # every trainable parameter


class Schedule(Choice):
    """The lr schedule after warmup (hydrali.core.optim.schedule.AFTER_WARMUP)."""

    cosine = "cosine"
    linear = "linear"
    constant = "constant"
    flat_cosine = "flat_cosine"


@dataclass
class TaskConfig:
    """What every task's `task` node holds (conf/task/*.yaml); a task's schema adds its own settings."""

    name: str = MISSING
    _target_: str = MISSING  # the task object (framework-neutral)
    sides: Dict[str, str] = field(default_factory=dict)  # framework -> the callable building that side
    monitor: str = MISSING
    mode: Mode = Mode.max


@dataclass
class DataConfig:
    """What every task's `data` node holds (conf/data/*.yaml): the keys core and tasks/base.py read. A task's schema
    gives batch_size and image_size their defaults and adds its own settings."""

    name: str = MISSING
    root: str = MISSING
    batch_size: int = MISSING  # images per replica and step
    global_batch: Optional[int] = None  # images per optimizer step, fixed whatever the replicas (conf/data)
    image_size: Optional[int] = MISSING
    num_classes: Optional[int] = None  # null: counted (tasks/base.py's check_prepared)
    verify: Verify = Verify.quick
    bad_files: BadFiles = BadFiles.fail


@dataclass
class PipelineConfig:
    """conf/pipeline/*.yaml: a DALI recipe and its knobs (documented in the YAML files)."""

    name: str = MISSING
    task: str = MISSING
    recipe: str = MISSING
    device: Device = Device.auto
    num_threads: int = 2
    hw_decoder_load: float = 1.0
    prefetch_queue_depth: int = 2
    worker_cores: WorkerCores = WorkerCores.auto
    train_last_batch: LastBatch = LastBatch.drop
    dtype: Dtype = Dtype.float
    options: Dict[str, Any] = field(default_factory=dict)
    autotune: bool = False  # probe num_threads (and hw_decoder_load on a GPU) before training
    autotune_by: AutotuneBy = AutotuneBy.training  # candidates timed by training steps, or by the pipeline alone
    autotune_threads: List[int] = field(default_factory=list)  # num_threads candidates; empty: automatic
    autotune_loads: List[float] = field(default_factory=lambda: [0.5, 0.8, 1.0])  # hw_decoder_load candidates
    autotune_warmup: int = 3  # batches run before timing (at least prefetch_queue_depth + 1)
    autotune_batches: int = 10  # batches timed per candidate
    checkpointing: bool = True  # DALI's reader and random state saved with every checkpoint (exact resume)


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
    weight_decay_on: WeightDecayOn = WeightDecayOn.kernels  # which parameters decay (conf/optim_common.yaml)
    momentum: float = 0.9
    nesterov: bool = False
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    backbone_lr_mult: float = 1.0
    accumulate_grad_batches: int = 1  # batches per optimizer step (conf/optim_common.yaml)
    warmup_steps: Optional[int] = None  # warmup in optimizer steps, instead of warmup_epochs (conf/optim_common.yaml)
    flat_fraction: float = 0.75  # schedule=flat_cosine: the share of the steps after warmup at the full lr
    ema_decay: Optional[float] = None  # an exponential moving average of the weights (conf/optim_common.yaml)


@dataclass
class TrackingConfig:
    """conf/tracking/*.yaml: the MLflow store and experiment."""

    enabled: bool = True
    uri: Optional[str] = None
    experiment: str = "hydrali"
    artifact_location: Optional[str] = None
    log_checkpoint: bool = True
    timeout_s: float = 10.0
    retries: int = 2
    ui_host: str = "127.0.0.1"
    ui_port: int = 5000


@dataclass
class PathsConfig:
    """conf/paths/*.yaml: where data, outputs and the MLflow store live."""

    root: str = MISSING
    data_dir: str = MISSING
    output_dir: str = MISSING
    cache_dir: Optional[str] = None  # the record of image files that passed data.verify (conf/paths/default.yaml)


@dataclass
class PreemptionConfig:
    """The `preemption` node (conf/config.yaml): the signals that save a checkpoint and stop the run."""

    signals: List[str] = field(default_factory=lambda: ["SIGUSR1", "SIGUSR2"])
    check_every_n_steps: int = 10  # with several processes: every how many optimizer steps they agree on a signal
    requeue: bool = True  # requeue the SLURM job with scontrol when no launcher does


@dataclass
class ProgressiveResizingConfig:
    """conf/config.yaml's progressive_resizing: smaller training images first (core/policies/resizing.py)."""

    start_side: Optional[int] = None  # null: off
    full_at: float = 0.75  # the fraction of the epochs from which training is at data.image_size
    multiple: int = 8  # the sides are multiples of this


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
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    seed: Optional[int] = 42
    deterministic: bool = False
    epochs: int = 10
    throughput_warmup_steps: int = 5
    cpu_threads: str = "auto"  # the framework's intra-op threads: auto | a number (conf/config.yaml)
    checkpoint_every: int = 1  # epochs between the per-epoch checkpoints, the last epoch's always (conf/config.yaml)
    keep_checkpoints: int = 1  # the newest per-epoch checkpoints kept, besides the best; 0: all (conf/config.yaml)
    validate_every: int = 1  # epochs between validations, the last epoch's always (conf/config.yaml)
    progress_bar: Any = "auto"  # auto | true | false (conf/config.yaml)
    progressive_resizing: ProgressiveResizingConfig = field(default_factory=ProgressiveResizingConfig)
    ckpt_path: Optional[str] = None
    optimized_metric: str = "val/acc"


GROUP_SCHEMAS = {  # the groups whose every option has one schema (backends and tasks bring theirs: the registry)
    "pipeline": PipelineConfig,
    "optim": OptimConfig,
    "tracking": TrackingConfig,
    "paths": PathsConfig,
}
