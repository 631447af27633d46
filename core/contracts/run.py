"""The run contract: everything a backend's `fit` is told, decided once in core (hydrali.core.run.contract builds it
from the composed config after every decision: the plan, autotune's choice, the `auto` settings).

A backend trains from these values and reads no config of its own: so the two backends cannot read the same setting
two ways, and a setting's meaning is decided where the contract is built. The task's own settings (its DALI recipe,
data and model nodes) travel in `TaskInputs`, which a backend hands to the task's methods without reading them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hydrali.core.run.plan import Plan


@dataclass(frozen=True)
class TaskInputs:
    """The config nodes a task's methods read (build_pipeline, output_specs, build_model): handed on, not read."""

    pipeline: Any
    data: Any
    model: Any


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer and lr schedule both backends build (hydrali.core.optim): the plan holds the lr and the
    batches accumulated per step."""

    name: str  # an Optimizer value: sgd | adamw
    weight_decay: float
    momentum: float
    nesterov: bool
    betas: tuple[float, float]
    backbone_lr_mult: float  # the backbone's lr is this x the head's
    warmup_epochs: float
    warmup_div: float
    schedule: str  # a Schedule value: cosine | linear | constant | flat_cosine
    warmup_steps: int | None  # the warmup in optimizer steps, replacing warmup_epochs; None: warmup_epochs
    ema_decay: float | None  # an exponential moving average of the weights (hydrali.core.optim.ema); None: off
    weight_decay_on: str = "kernels"  # a WeightDecayOn value: the parameters weight_decay applies to
    flat_fraction: float = 0.75  # schedule=flat_cosine: the share of the steps after warmup at the full lr


@dataclass(frozen=True)
class TrainedRunSpec:
    """What a backend's `load_trained` rebuilds a trained run's network from, for inference (hydrali eval, predict,
    export)."""

    model: Any  # the run's model node as built (untrained: no pretrained download), handed to the task's builder
    image_size: int
    precision: str  # a Precision value, `auto` decided for this machine
    backend: Any  # the backend's own settings: an instance of its BackendSpec.schema, `auto` decided


@dataclass(frozen=True)
class RunContract:
    """What a backend's `fit` trains by."""

    plan: Plan  # ranks, shards, batches, lr, seed, epochs, the epoch steps
    optim: OptimizerSettings
    task_inputs: TaskInputs
    image_size: int  # the network's input side, in pixels
    image_dtype: str  # the dtype of the images DALI hands over (pipeline.dtype)
    reader_checkpointing: bool  # DALI's reader position saved with mid-epoch checkpoints (pipeline.checkpointing)
    batches_from_memory: bool  # the recipe feeds its batches from Python (pipeline.options.decode_once:
    #   fn.external_source over the split decoded once), which a backend's DALI plugin may feed otherwise
    precision: str  # a Precision value, `auto` decided
    compile: bool  # torch.compile on Lightning, XLA on Keras, `auto` decided
    deterministic: bool
    monitor: str  # the metric that names the best epoch (task.monitor)
    mode: str  # min | max
    network: str  # how the log names the network
    start_weights: str | None  # model.weights: an earlier run the network starts from (None: its builder's own)
    throughput_warmup_steps: int  # steps of each epoch left out of the steady images/s
    checkpoint_every: int  # epochs between the per-epoch checkpoints (saves_checkpoint)
    keep_checkpoints: int  # the newest per-epoch checkpoints kept besides the best; 0: all (core/policies/retention.py)
    validate_every: int  # epochs between validations (validates)
    progress_bar: bool  # a bar of each epoch's steps on the console (`auto` decided: on a terminal)
    callbacks: tuple[Any, ...]  # the user's framework callbacks (backend.callbacks), instantiated
    backend: Any  # the backend's own settings: an instance of its BackendSpec.schema, `auto` decided
    train_sizes: tuple[int, ...] = ()  # the training images' size (pixels a side) in each epoch
    #   (progressive_resizing); (): image_size

    def training_size(self, epoch: int) -> int | None:
        """The size (pixels a side) the training batches of epoch `epoch` (0-based) are scaled to, on every backend;
        None: they stay as the pipeline made them (data.image_size)."""
        if not self.train_sizes:
            return None
        size = self.train_sizes[min(epoch, len(self.train_sizes) - 1)]
        return None if size == self.image_size else size

    def pipeline(self, task: Any, dataset: Any, shard: Any, layout: str, is_training: bool, **reader: Any) -> Any:
        """The task's DALI pipeline (not built) of one replica's `shard`, from the contract's task inputs and plan,
        its images in `layout`; `reader`: the pipeline's checkpointing arguments (checkpointing, restore)."""
        inputs = self.task_inputs
        return task.build_pipeline(
            pipeline=inputs.pipeline,
            data=inputs.data,
            model=inputs.model,
            dataset=dataset,
            plan=self.plan,
            shard=shard,
            layout=layout,
            is_training=is_training,
            **reader,
        )

    def saves_checkpoint(self, epoch: int) -> bool:
        """Whether the epoch numbered `epoch` (counted from 1) ends with a checkpoint, on every backend: every
        `checkpoint_every`th epoch and the run's last."""
        return self._every(epoch, self.checkpoint_every)

    def validates(self, epoch: int) -> bool:
        """Whether the epoch numbered `epoch` (counted from 1) ends with a validation, on every backend: every
        `validate_every`th epoch and the run's last."""
        return self._every(epoch, self.validate_every)

    def validation_epochs(self) -> list[int]:
        """The epochs (counted from 1) that end with a validation."""
        return [epoch for epoch in range(1, self.plan.epochs + 1) if self.validates(epoch)]

    def _every(self, epoch: int, interval: int) -> bool:
        return epoch % interval == 0 or epoch >= self.plan.epochs
