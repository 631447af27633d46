"""The task interface: what core and every backend ask of a task (`Task`, its `Dataset`), and what a backend asks
of the task's side on its framework (`TorchSide`, `KerasSide`).

A task is framework-neutral: it prepares its data and builds its DALI pipelines. Its framework code (model, loss,
metrics, validation) lives in files named by framework (`torch_*.py`, `keras_*.py`), reached through one mapping
of its config, `task.sides`: framework -> "module.callable" building that side. A backend trains the side of its
spec's `framework`; a new backend on an existing framework needs no change to any task.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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


class Dataset(Protocol):
    """What a task's prepared data tells core: counts for the epoch contract, and params for the tracker."""

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


class TorchSide(Protocol):
    """A task's side on torch (an nn.Module holding the network): built by `task.sides.torch`, called as
    `build(task, model_cfg, dataset, image_size)`."""

    def training_loss(self, batch: dict) -> tuple[Any, int]:
        """The loss of one training batch and the number of images in it."""

    def validation_step(self, batch: dict) -> tuple[Any, int]:
        """The loss of one validation batch and its number of real images; its metrics accumulate."""

    def val_metrics_compute(self, epoch: int) -> dict[str, Any]:
        """The validation metrics accumulated since the last reset, over every process (val/...)."""

    def val_metrics_reset(self) -> None:
        """Start a new validation."""

    # For the commands on a trained run: `prediction_names` and `predict(batch) -> dict of tensors` (what eval and
    # predict score); optionally `serving_names` and `serving(batch)`, what export writes (else predict's).


class KerasSide(Protocol):
    """A task's side on Keras: built by `task.sides.keras`, called as `build(task, dataset)`."""

    def build_model(self, model_cfg: DictConfig, num_classes: int, image_size: int) -> Any:
        """The keras.Model of `model_cfg`."""

    def loss(self) -> Any:
        """The keras loss."""

    def metrics(self) -> list:
        """Keras metrics compiled with the model."""

    def callbacks(self) -> list:
        """Keras callbacks adding the task's validation metrics to each validated epoch's logs."""

    # For the commands on a trained run: `prediction_names` and `predict(network, batch) -> dict of tensors`;
    # optionally `serving_names` and `serving(network, batch)`, what export writes (else predict's).


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
