"""The backend interface: what core knows of a backend before its framework loads (`BackendSpec`), and what a
loaded backend does for a run (`Backend`).

A backend registers a `BackendSpec` (core/contracts/registry.py). The spec is light: `hydrali --help`, the config
schema and checkpoint resolution read it without importing torch or TensorFlow. Its `implementation` names the
class that trains, imported only when a run uses the backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hydrali.core.contracts.run import RunContract, TrainedRunSpec
    from hydrali.core.process.preemption import PreemptionWatch
    from hydrali.core.run.plan import Plan
    from hydrali.core.run.record import RunRecord
    from hydrali.core.run.results import FitResult


class Capability(str, Enum):
    """What a run may ask of its backend beyond training as the contract says (a spec's `supports`: core refuses, in
    one line before anything is written, a run asking one its backend lacks)."""

    progressive_resizing = "progressive_resizing"  # training at smaller sides first (contract.training_sizes)
    start_from_run = "start_from_run"  # model.weights naming an earlier hydrali run (contract.start_weights)


@dataclass(frozen=True)
class AutoSwitch:
    """A true | false | auto key of a backend's config that core decides for the device
    (core/policies/auto_settings.py): `auto` is true on a GPU and false on a CPU; false also under deterministic=true
    where `off_when_deterministic`."""

    key: str  # its key under `backend`
    off_when_deterministic: bool = False


@dataclass(frozen=True)
class BackendSpec:
    """A backend as core sees it before loading it."""

    name: str  # its option of the `backend` config group (backend=<name>)
    framework: str  # the side of a task it trains: a key of the task's `sides` (torch | keras)
    framework_label: str  # how messages name that framework (torch, TensorFlow)
    summary: str  # one line for `hydrali --help`
    schema: type  # the dataclass of its `backend` config node
    checkpoint_suffix: str  # how its checkpoint files end (checkpoints of another backend are refused)
    implementation: str  # "module:Class" of its `Backend`, imported only to train
    # whether a resume restores DALI's reader position (pipeline.checkpointing) rather than starting the pipelines
    #   afresh at the resumed epoch (core then seeds them for that epoch: core.run.plan.Plan.resumed_at)
    resumes_reader_position: bool = False
    # its true | false | auto keys, which core decides for the device the run trains on
    auto_switches: tuple[AutoSwitch, ...] = ()
    # keys of its config (under `backend`) that core refuses, each with the key that does its job on every backend
    replaced_keys: Mapping[str, str] = field(default_factory=dict)
    # a check of its settings beyond its schema's types (raises a HydraliError naming the key), or None
    check_settings: Callable[[Any], None] | None = None
    # the key of a model config naming the builder of its framework's network (torch: _target_)
    network_key: str = "_target_"
    # under -m, a job whose processes its framework's own launcher would start is refused: the settings that let
    #   hydrali start them instead, ending with ", or " (the message goes on: "start them with torchrun or srun")
    sweep_launch_hint: str = ""
    # what it honours beyond the contract's training (a run asking another is refused before it starts)
    supports: frozenset[Capability] = frozenset(Capability)
    # its config keys (dotted: backend.<key>) added after runs were recorded without them, each with the value such a
    #   run was trained with (as TaskSpec.added_keys: a run of an earlier release resumes, is evaluated, gives weights)
    added_keys: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingDevice:
    """The device a backend trains this process's replicas on, as core's `auto` settings need it
    (hydrali.core.policies.auto_settings)."""

    kind: str  # gpu | cpu
    name: str  # as the framework names it (e.g. "NVIDIA H100 80GB HBM3", "CPU")
    capability: tuple[int, int] | None = None  # a GPU's CUDA compute capability (None on a CPU or when unknown)


@runtime_checkable
class TrainedNetwork(Protocol):
    """A run's network loaded from one of its checkpoints, ready for inference (hydrali eval, predict, export).
    Core reads the batches (hydrali.core.inference.batches) and scores the outputs; the network only runs."""

    formats: tuple[str, ...]  # the export formats (core.inference.schema.ExportFormat values) it can write

    def predict(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The task side's predictions (NumPy arrays, e.g. classification's `logits`) for a batch of the task's
        recipe outputs (NumPy arrays in the backend's layout), in evaluation mode at the run's precision."""

    def serve(self, batch: dict[str, Any]) -> dict[str, Any]:
        """What an exported model computes, by the framework: the side's `serving` (e.g. detection's decoded boxes
        and class probabilities, NMS left to the serving stack), else its `predict`."""

    def export(self, fmt: str, folder: Path, example: dict[str, Any]) -> Path:
        """Write the network in format `fmt` into `folder` (traced or checked on `example`, a batch); return the
        file or folder a serving stack loads."""

    def run_export(self, path: Path, fmt: str, batch: dict[str, Any]) -> dict[str, Any]:
        """The outputs of the exported model at `path` on `batch`, computed by its own runtime (onnxruntime,
        TorchScript, TensorFlow), named as `serve` names them."""


@runtime_checkable
class TrainingProbe(Protocol):
    """A throwaway copy of a run's network and optimizer (its precision, compile and layout settings), trained on
    the batches of a DALI pipeline it is given: what `pipeline.autotune_by=training` times its candidates with
    (hydrali.core.data.autotune). It changes nothing of the run: the run builds its own network afterwards."""

    def steps_on(self, pipe: Any) -> Any:
        """A callable that trains one step on the next batch of `pipe` (a DALI pipeline of the run's training
        recipe, not yet built) and returns what `wait` takes."""

    def wait(self, output: Any) -> None:
        """Return once the step that returned `output`, and every step before it, has run on the device."""

    def close(self) -> None:
        """Free the network, its optimizer and the pipelines' feeds."""


@runtime_checkable
class Backend(Protocol):
    """How a run trains on one framework. Core calls these in this order: visible_gpus, replicas, use_cpu_threads,
    training_device, (share_from_rank0), newest_checkpoint / checkpoint_epochs, processes_to_start, training_probe (with
    pipeline.autotune), fit. The commands on a trained run (hydrali eval, predict, export) call newest_checkpoint
    and load_trained."""

    layout: str  # the layout of each image its framework wants from DALI: CHW (torch) | HWC (Keras)

    def visible_gpus(self) -> int:
        """The number of GPUs the framework can train on in this process."""

    def replicas(self, backend: Any, device: str) -> tuple[int, int, int]:
        """(replicas per node, nodes, replicas per process) of the job, from its `backend` settings (an instance of
        its spec's schema) and the device DALI runs on; a HydraliError names a setting that cannot work."""

    def training_device(self, backend: Any) -> TrainingDevice:
        """The device this process trains on with the `backend` settings (its first GPU, or the CPU)."""

    def processes_to_start(self, backend: Any) -> int:
        """How many processes hydrali itself starts for the job on this node (1: this one trains alone)."""

    def use_cpu_threads(self, threads: int) -> None:
        """Let the framework's compute (intra-op) thread pool of this process use `threads` threads (cpu_threads,
        decided by core before any pipeline or network is built)."""

    def share_from_rank0(self, values: dict[str, Any], plan: Plan) -> dict[str, Any]:
        """Rank 0's JSON-able `values` on every process of a job that a launcher started."""

    def newest_checkpoint(self, checkpoint_dir: Path) -> Path | None:
        """The checkpoint `ckpt_path=last` resumes from in `checkpoint_dir`, if there is one."""

    def checkpoint_epochs(self, path: Path) -> int:
        """How many whole epochs the checkpoint at `path` holds; a HydraliError if it is not one of this backend."""

    def load_trained(self, *, run: TrainedRunSpec, task: Any, dataset: Any, checkpoint: Path) -> TrainedNetwork:
        """The network of the trained `run`, with the weights of `checkpoint` (one of this backend's), for
        `dataset`'s classes; a HydraliError when the checkpoint does not fit it."""

    def training_probe(self, *, contract: RunContract, task: Any, dataset: Any) -> TrainingProbe:
        """The run's network and optimizer as `contract` describes them, built apart for pipeline.autotune to time
        training steps with."""

    def fit(
        self,
        *,
        contract: RunContract,
        task: Any,
        dataset: Any,
        record: RunRecord,
        resume_from: Path | None,
        output_dir: Path,
        preemption: PreemptionWatch | None = None,
    ) -> FitResult:
        """Train `task` on this process's shards as `contract` says (core.contracts.run: the plan and every setting
        the backend trains by; it reads no config), its framework's generators seeded first with the plan's seed
        (deterministic algorithms under contract.deterministic), recording each epoch into `record` and saving
        checkpoints under `output_dir`; resume from `resume_from` when given. After each training step, when the
        job's processes agree that `preemption` noted a signal, save a checkpoint to resume from as the backend
        can (mid-epoch where its data loader keeps DALI's state) and raise core.process.preemption.Preempted."""
