"""The task interface: what core and every backend ask of a task (`Task`, its `Dataset`), and what a backend asks
of the task's side on its framework (`TorchSide`, `KerasSide`: every hook a backend calls, required or optional, the
optional ones' defaults in `TorchSideDefaults`, `KerasSideDefaults`; a built side is checked by `checked_side`).

A task is framework-neutral: it prepares its data and builds its DALI pipelines. Its framework code (model, loss,
metrics, validation) lives in files named by framework (`torch_*.py`, `keras_*.py`), reached through one mapping
of its config, `task.sides`: framework -> "module.callable" building that side. A backend trains the side of its
spec's `framework`; a new backend on an existing framework needs no change to any task.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from hydrali.core.errors import HydraliError, first_line

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from hydrali.core.run.plan import Plan, Shard


# Settings of a `model` node that are not its builder's (conf/model_common.yaml): applied to the built network, read
# by core before it is built (core/data/weights_preprocessing.py), or saying where its weights come from.
FINE_TUNING_KEYS = ("freeze",)
PREPROCESSING_KEYS = ("preprocessing", "weights_preprocessing")
STARTING_POINT_KEYS = ("weights", "pretrained")  # where the weights come from, not which network it is


@dataclass(frozen=True)
class TaskSpec:
    """A task as core sees it before building it: the schemas of its config nodes."""

    name: str  # its option of the `task` config group (task=<name>)
    task_schema: type  # the dataclass of its `task` node (a subclass of core.config.schema.TaskConfig)
    data_schema: type  # the dataclass of the `data` node of every dataset it reads
    fine_tunes: bool = False  # its sides tell a network's backbone from its head (model.freeze, optim.backbone_lr_mult,
    #   model.weights=<a hydrali run>: `initialise_from` on each side)
    trains_scaled_down: bool = False  # its training batches may be scaled down (progressive_resizing): images and
    #   labels alone, nothing measured in pixels (a box would move)
    added_keys: Mapping[str, Any] = field(default_factory=dict)  # config keys (dotted) added after runs were
    #   recorded without them, each with the value such a run was trained with: a record lacking one is compared as
    #   if it held that value (a run of an earlier release resumes, is evaluated, or gives its weights)
    network_checks: Mapping[str, str] = field(default_factory=dict)  # a network builder of the task (its import
    #   path, as a model config's `_target_` or `keras_target` names it) -> the import path of a check of the model
    #   config that imports no framework, run before the run dir is touched (core/config/network_check.py)


class Dataset(Protocol):
    """What a task's prepared data tells core: counts for the epoch steps, and params for the tracker."""

    num_train: int
    num_val: int
    num_classes: int
    skipped: tuple[tuple[Any, str], ...]  # image files left out (data.bad_files=skip) and why: listed in the run dir

    def params(self) -> dict[str, Any]:
        """What describes the data, for the run's tracker (flat names and values)."""


@runtime_checkable
class Task(Protocol):
    """A task: its data, its DALI pipelines, the names and shapes of their outputs, and its framework sides."""

    name: str
    monitor: str  # the metric that picks the best checkpoint (e.g. val/acc)
    mode: str  # max | min: whether a larger `monitor` is better
    sides: Mapping[str, str]  # framework -> "module.callable" building the task's side on it

    def prepare_data(self, data: DictConfig, verify: str) -> Dataset:
        """The dataset on disk (written first when it is a bundled one), checked as `verify` says."""

    def output_names(self, is_training: bool) -> tuple[str, ...]:
        """What the task's DALI recipes return, in order."""

    def output_specs(
        self, *, batch: int, image_size: int, image_dtype: str, is_training: bool, model: DictConfig
    ) -> tuple[tuple[tuple[int, ...], str], ...]:
        """(shape, dtype) of each batched output in HWC layout, for frameworks that need them up front."""

    def build_pipeline(
        self,
        *,
        pipeline: DictConfig,
        data: DictConfig,
        model: DictConfig,
        dataset: Dataset,
        plan: Plan,
        shard: Shard,
        layout: str,
        is_training: bool,
        checkpointing: bool = False,
        restore: str | None = None,
    ) -> Any:
        """The DALI pipeline (not yet built) of one replica's shard of one split; with `checkpointing`, one whose
        reader and random state DALI can save (`restore`: a state it saved, to continue from)."""

    def artifacts(self) -> list[tuple[Any, str]]:
        """Files the task wrote for the run's tracker: (path, artifact folder)."""

    def explain_decode_error(self, dataset: Dataset) -> str | None:
        """After a decoder failed: one line naming the dataset's files that cannot be decoded, if any."""


class Scores(Protocol):
    """What `hydrali eval` accumulates over a split (a task's `scores(dataset)`), framework-neutral."""

    images: int  # images scored so far

    def update(self, predictions: dict[str, Any], batch: dict[str, Any]) -> None:
        """Add a batch: the side's predictions and the recipe's outputs (NumPy arrays)."""

    def metrics(self) -> dict[str, float]:
        """The task's metrics, named as in training without the split (acc; map, map50)."""

    def report(self) -> dict[str, Any]:
        """What metrics.json holds besides them (per-class figures, a confusion matrix)."""

    def per_class_table(self) -> list[str]:
        """The per-class figures as lines for the terminal."""

    def write_pictures(self, folder: Any) -> list[Any]:
        """Pictures of the scores written into `folder` (none is fine)."""


class Predictions(Protocol):
    """What `hydrali predict` accumulates and writes (a task's `predictions(dataset, top_k)`)."""

    def update(self, files: list[str], predictions: dict[str, Any], batch: dict[str, Any]) -> None:
        """Add a batch: the files it read (in order), the side's predictions and the recipe's outputs."""

    def write(self, folder: Any) -> list[Any]:
        """Write the predictions into `folder`; return the files written."""


class InferenceTask(Protocol):
    """What a task adds for the commands on a trained run (hydrali.core.inference); each is optional, and a command
    whose method a task lacks is refused in one line."""

    def evaluation_data(self, data: DictConfig, split: str, verify: str) -> Dataset:
        """The dataset whose validation split is `split` (hydrali eval)."""

    def prediction_data(self, dataset: Dataset, folder: Any, files: list[str], annotations: str | None) -> Dataset:
        """A dataset whose validation split is `files` of `folder`, with `dataset`'s classes (hydrali predict)."""

    def scores(self, dataset: Dataset) -> Scores:
        """A fresh Scores of the dataset's validation split."""

    def predictions(self, dataset: Dataset, top_k: int) -> Predictions:
        """A fresh Predictions of the dataset's validation split."""


class ShardableTask(Protocol):
    """What a task adds for `hydrali convert` (hydrali.core.data.convert); optional, and refused in one line when
    lacking. Its recipes read the shards back when their source is a hydrali.core.data.webdataset.ShardSource."""

    def shard_samples(self, dataset: Dataset, split: str, seed: int | None) -> tuple[int, Iterator[dict[str, Any]]]:
        """(how many, the samples) of `split`: each a dict of `__key__` and file extension -> bytes, shuffled with
        `seed` (None: in the dataset's order)."""

    def shard_facts(self, dataset: Dataset) -> dict[str, Any]:
        """What the shards' manifest records about the data for the task to read them back (classes, counts)."""

    # Optional: `shard_files(dataset) -> dict[str, bytes]`, files the shards' folder holds besides the tars (path
    # relative to it -> content), e.g. the annotation file a detection run scores against; the facts name them.
    # Optional: `shard_reading`, the overrides that train from the shards, as convert prints them (data=webdataset).


@runtime_checkable
class TorchSide(Protocol):
    """A task's side on torch: an nn.Module (the backend moves, trains, averages, saves and loads it as one) holding
    the network, its loss and its validation metrics; built by `task.sides.torch`, called as
    `build(task, model_cfg, dataset, image_size)`. Every hook a torch backend calls is listed here: the required
    ones (TORCH_SIDE.required) a side defines itself, the optional ones (TORCH_SIDE.optional) it may leave to
    TorchSideDefaults, which a side derives from. A side lacking a hook is refused when it is built."""

    # required
    model: Any  # the network (an nn.Module): what backend.compile compiles; its keys in a checkpoint are `model.*`
    prediction_names: tuple[str, ...]  # what `predict` returns, in this order (hydrali eval, predict)

    def training_loss(self, batch: dict) -> tuple[Any, int]:
        """The loss of one training batch and the number of images in it."""

    def validation_step(self, batch: dict) -> tuple[Any, int]:
        """The loss of one validation batch and its number of real images; its metrics accumulate."""

    def val_metrics_compute(self, epoch: int) -> dict[str, Any]:
        """The validation metrics accumulated since the last reset, over every process (val/...)."""

    def val_metrics_reset(self) -> None:
        """Start a new validation."""

    def predict(self, batch: dict) -> dict[str, Any]:
        """The predictions (tensors named by `prediction_names`) for a batch of recipe outputs: what eval and predict
        score."""

    # optional (TorchSideDefaults)
    serving_names: tuple[str, ...]  # what `serving` returns, in this order (default: prediction_names)

    def serving(self, batch: dict) -> dict[str, Any]:
        """What hydrali export writes, from a batch of images alone (default: `predict`)."""

    def initialise_from(self, state: dict) -> bool:
        """Start the network from another run's state_dict of this side (model.weights), a new head when the classes
        differ; whether the head was loaded too (default: refused, the side cannot start from another run)."""

    def backbone_parameters(self) -> list:
        """The parameters of the network's backbone, for optim.backbone_lr_mult (default: refused)."""


class TorchSideDefaults:
    """The optional hooks of TorchSide as a side has them when it does not define them; a torch side derives from
    it (beside nn.Module)."""

    @property
    def serving_names(self) -> tuple[str, ...]:
        """What `serving` returns: `prediction_names`."""
        return tuple(self.prediction_names)

    def serving(self, batch: dict) -> dict[str, Any]:
        """What hydrali export writes: the side's `predict`."""
        return self.predict(batch)

    def initialise_from(self, state: dict) -> bool:
        """Refused: the side cannot start from another run's weights."""
        raise HydraliError(
            f"the task's torch side {_lacking(self, 'initialise_from')} start from another run's weights"
        )

    def backbone_parameters(self) -> list:
        """Refused: the side does not tell its network's backbone from its head."""
        raise HydraliError(
            f"the task's torch side {_lacking(self, 'backbone_parameters')} tell its backbone from its head"
        )


@runtime_checkable
class KerasSide(Protocol):
    """A task's side on Keras: built by `task.sides.keras`, called as `build(task, dataset)`; it builds the network
    and gives its loss, metrics and validation. Every hook a Keras backend calls is listed here: the required ones
    (KERAS_SIDE.required) a side defines itself, the optional ones (KERAS_SIDE.optional) it may leave to
    KerasSideDefaults, which a side derives from. A side lacking a hook is refused when it is built."""

    # required
    prediction_names: tuple[str, ...]  # what `predict` returns, in this order (hydrali eval, predict)

    def build_model(self, model_cfg: DictConfig, num_classes: int, image_size: int) -> Any:
        """The keras.Model of `model_cfg`."""

    def loss(self) -> Any:
        """The keras loss."""

    def metrics(self) -> list:
        """Keras metrics compiled with the model."""

    def callbacks(self) -> list:
        """Keras callbacks adding the task's validation metrics to each validated epoch's logs."""

    def predict(self, network: Any, batch: dict) -> dict[str, Any]:
        """The predictions of `network` (tensors named by `prediction_names`) for a batch of recipe outputs: what
        eval and predict score."""

    # optional (KerasSideDefaults)
    serving_names: tuple[str, ...]  # what `serving` returns, in this order (default: prediction_names)

    def serving(self, network: Any, batch: dict) -> dict[str, Any]:
        """What hydrali export writes, from a batch of images alone (default: `predict`)."""

    def evaluation_forward(self, network: Any, images: Any) -> Any:
        """What validation scores of a batch's images (e.g. flip-averaged); default: the network's output in
        inference mode."""

    def on_val_batch(self, data: Any, predictions: Any, weights: Any) -> None:
        """A look at each validation batch, in the graph: its recipe outputs, the predictions and each sample's
        weight (0: padding); default: nothing."""

    def initialise_from(self, network: Any, trained: Any) -> bool:
        """Start `network` from `trained`, another run's network of the same config (model.weights), a new head
        when the classes differ; whether the head was copied too (default: refused)."""

    def backbone_variables(self, network: Any) -> list:
        """The trainable variables of the network's backbone, for optim.backbone_lr_mult (default: refused)."""


class KerasSideDefaults:
    """The optional hooks of KerasSide as a side has them when it does not define them; a Keras side derives from
    it."""

    @property
    def serving_names(self) -> tuple[str, ...]:
        """What `serving` returns: `prediction_names`."""
        return tuple(self.prediction_names)

    def serving(self, network: Any, batch: dict) -> dict[str, Any]:
        """What hydrali export writes: the side's `predict`."""
        return self.predict(network, batch)

    def evaluation_forward(self, network: Any, images: Any) -> Any:
        """What validation scores: the network's output on the images, in inference mode."""
        return network(images, training=False)

    def on_val_batch(self, data: Any, predictions: Any, weights: Any) -> None:
        """Nothing: the side's Keras metrics see every validation batch."""

    def initialise_from(self, network: Any, trained: Any) -> bool:
        """Refused: the side cannot start from another run's weights."""
        raise HydraliError(
            f"the task's Keras side {_lacking(self, 'initialise_from')} start from another run's weights"
        )

    def backbone_variables(self, network: Any) -> list:
        """Refused: the side does not tell its network's backbone from its head."""
        raise HydraliError(
            f"the task's Keras side {_lacking(self, 'backbone_variables')} tell its backbone from its head"
        )


def _lacking(side: Any, hook: str) -> str:
    return f"({type(side).__name__}) has no `{hook}`: it cannot"


@dataclass(frozen=True)
class SideInterface:
    """What a backend calls on a task's side of one framework: the protocol declaring every hook, which of them a
    side must define (`required`) and which it may leave to `defaults` (`optional`, the class a side derives from)."""

    protocol: type
    required: tuple[str, ...]
    optional: tuple[str, ...]
    defaults: type

    def missing(self, side: Any) -> tuple[list[str], list[str]]:
        """The required and the optional hooks that `side` lacks."""
        if isinstance(side, self.protocol):
            return [], []
        return [n for n in self.required if not hasattr(side, n)], [n for n in self.optional if not hasattr(side, n)]


TORCH_SIDE = SideInterface(
    TorchSide,
    required=(
        "model",
        "prediction_names",
        "training_loss",
        "validation_step",
        "val_metrics_compute",
        "val_metrics_reset",
        "predict",
    ),
    optional=("serving_names", "serving", "initialise_from", "backbone_parameters"),
    defaults=TorchSideDefaults,
)
KERAS_SIDE = SideInterface(
    KerasSide,
    required=("prediction_names", "build_model", "loss", "metrics", "callbacks", "predict"),
    optional=(
        "serving_names",
        "serving",
        "evaluation_forward",
        "on_val_batch",
        "initialise_from",
        "backbone_variables",
    ),
    defaults=KerasSideDefaults,
)


def checked_side(side: Any, interface: SideInterface, task: Task, framework: str) -> Any:
    """`side`, the side `task.sides[framework]` built, when it has every hook of `interface`; else a HydraliError
    naming the hooks it lacks (required ones first)."""
    required, optional = interface.missing(side)
    where = f"task.sides.{framework}={task.sides[framework]}: its side ({type(side).__name__})"
    protocol = f"{interface.protocol.__module__}.{interface.protocol.__name__}"
    if required:
        raise HydraliError(
            f"{where} lacks the required hook{'s' * (len(required) > 1)} {', '.join(required)} of {protocol}"
        )
    if optional:
        defaults = f"{interface.defaults.__module__}.{interface.defaults.__name__}"
        raise HydraliError(
            f"{where} lacks the optional hook{'s' * (len(optional) > 1)} {', '.join(optional)} of {protocol}: derive "
            f"it from {defaults}, which gives their defaults"
        )
    return side


def side_builder(task: Task, framework: str, backend: str) -> Callable[..., Any]:
    """The callable that builds `task`'s side on `framework` (for backend `backend`); a HydraliError naming the
    setting when the task has no such side or it cannot be imported."""
    from hydra.utils import get_method

    if framework not in task.sides:
        raise HydraliError(
            f"task={task.name} has no side on {framework}, the framework of backend={backend}: its "
            f"sides are {', '.join(sorted(task.sides)) or 'none'} (task.sides.<framework>=module.callable)"
        )
    try:
        return get_method(task.sides[framework])
    except Exception as err:
        raise HydraliError(
            f"task.sides.{framework}={task.sides[framework]} cannot be imported: {first_line(err.__cause__ or err)}"
        ) from err
