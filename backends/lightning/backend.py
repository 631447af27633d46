"""Training a task with PyTorch Lightning: the `fit` that hydrali.core.run.runner calls for backend=lightning."""

from __future__ import annotations

import functools
import logging
import signal
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import Strategy

from hydrali.backends.lightning import agreement
from hydrali.backends.lightning.callbacks import (
    Observe,
    ReaderPosition,
    StopOnSignal,
    ValidationEpochs,
    progress_bar,
)
from hydrali.backends.lightning.checkpoints import (
    EPOCH_FILE,
    LAST,
    EpochNumberCheckpoint,
    LastCheckpoint,
    best_epoch_file,
    drop_later,
    epochs_of,
    newest,
    prune_epoch_files,
    read_lazily,
)
from hydrali.backends.lightning.data import DaliDataModule
from hydrali.backends.lightning.ddp import SameStreamDDPStrategy
from hydrali.backends.lightning.module import HydraliModule, precision_plugin
from hydrali.backends.lightning.spec import SPEC, LightningBackendConfig
from hydrali.backends.torch.collectives import all_gather_bytes
from hydrali.backends.torch.device import training_device_of, use_cpu_threads
from hydrali.backends.torch.loaders import LAYOUT, ResumableDaliLoader
from hydrali.backends.torch.seeding import seed_torch
from hydrali.backends.torch.side import build_torch_side, compile_torch_side, start_side_from
from hydrali.core.contracts.backend import TrainingDevice
from hydrali.core.contracts.run import RunContract, TrainedRunSpec
from hydrali.core.distributed import gather, topology
from hydrali.core.distributed.device_count import devices_per_node
from hydrali.core.errors import HydraliError, first_line
from hydrali.core.process.preemption import PreemptionWatch
from hydrali.core.run import weights_from_run
from hydrali.core.run.checkpoints import CHECKPOINT_DIR
from hydrali.core.run.observer import TrainingObserver
from hydrali.core.run.plan import Plan
from hydrali.core.run.record import RunRecord
from hydrali.core.run.results import FitResult
from hydrali.core.run.summary import model_line

log = logging.getLogger("hydrali")
# Noise from inside Lightning that a user can do nothing about.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
# hydrali manages the run's checkpoints/ (trained_with.json, resume): a non-empty folder is expected there
warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
# the training loader's DALI state is restored by hydrali's ReaderPosition callback, not through Lightning's loader
warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended")
# model.freeze keeps the frozen backbone in eval mode on purpose (its BatchNorm statistics stay)
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")
SELF_LAUNCHED = ("auto", "ddp", "ddp_find_unused_parameters_true")  # strategies whose processes hydrali starts


def newest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The checkpoint in `checkpoint_dir` a resume continues from (last.ckpt, or the newest epoch's file where a
    stop came before last.ckpt named it), if there is one."""
    return newest(checkpoint_dir)


def node_devices(backend: LightningBackendConfig) -> int:
    """The devices (processes) per node that backend.devices names (hydrali.core.distributed.device_count):
    `auto` is every GPU torch sees, or 1 on the CPU (backend.accelerator=cpu, or no GPU)."""
    gpus = 0 if str(backend.accelerator) == "cpu" else torch.cuda.device_count()
    return devices_per_node(backend.devices, gpus, launched_externally=topology.launched_externally())


def training_strategy(backend: LightningBackendConfig) -> str | Strategy:
    """Lightning's strategy for backend.strategy: when several processes train under DDP (auto, ddp,
    ddp_find_unused_parameters_true), DDP with gradient buckets of backend.ddp_bucket_mb MiB; else the strategy
    as named."""
    name = str(backend.strategy)
    if name not in SELF_LAUNCHED or node_devices(backend) * backend.num_nodes == 1:
        return name
    return SameStreamDDPStrategy(
        bucket_cap_mb=float(backend.ddp_bucket_mb),
        find_unused_parameters=name == "ddp_find_unused_parameters_true",
    )


def _quiet_duplicate_logs() -> None:
    """Lightning's loggers print through their own handler and again through the root one Hydra set up:
    keep only the root's (it also writes the job's log file), without Lightning's advertising tips."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logger = logging.getLogger(name)
        if logging.getLogger().handlers:
            logger.handlers.clear()
            logger.propagate = True
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoStartupNoise) for f in rank_zero.filters):
        rank_zero.addFilter(_NoStartupNoise())
    for handler in logging.getLogger().handlers:  # the console's: DDP's set-up lines go to the log file only
        console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if console and not any(isinstance(f, _LogFileOnly) for f in handler.filters):
            handler.addFilter(_LogFileOnly())


# Lightning's lines that tell a hydrali user nothing: its tips, the devices it did not use (the plan names the
# device), the end of fit (the summary follows) and its Ctrl+C line (hydrali's own one line says what happened)
LIGHTNING_NOISE = (
    "Tip:",
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "`Trainer.fit` stopped:",
    "Detected KeyboardInterrupt",
)


# Lightning's lines of DDP's set-up (each process's rank, the backend, the process count): the plan line says the
# replicas on the console; the log file keeps these for whoever debugs a launch
DDP_SETUP_LINES = ("Initializing distributed:", "All distributed processes registered")


class _LogFileOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not any(line in message for line in DDP_SETUP_LINES)


class _NoStartupNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not any(noise in message for noise in LIGHTNING_NOISE)


class LightningBackend:
    """backend=lightning (core.contracts.backend.Backend): one process per device, DDP across them."""

    layout = LAYOUT

    def visible_gpus(self) -> int:
        """The number of GPUs torch can train on."""
        return torch.cuda.device_count()

    def use_cpu_threads(self, threads: int) -> None:
        """torch's intra-op threads (core's cpu_threads)."""
        use_cpu_threads(threads)

    def training_device(self, backend: LightningBackendConfig) -> TrainingDevice:
        """The GPU torch trains on (the current CUDA device), or the CPU with backend.accelerator=cpu or no GPU."""
        if str(backend.accelerator) == "cpu" or not torch.cuda.is_available():
            return training_device_of(torch.device("cpu"))
        return training_device_of(torch.device("cuda", torch.cuda.current_device()))

    def processes_to_start(self, backend: LightningBackendConfig) -> int:
        """How many processes hydrali starts for this job on this node: one per device under DDP, chosen by
        `strategy=auto` as soon as there are several (started from the job's resolved config, not by re-running
        the command line as Lightning's launcher would); one when a launcher (torchrun, SLURM, MPI) started the
        processes or the strategy is not DDP."""
        devices = node_devices(backend)
        if devices > 1 and str(backend.strategy) in SELF_LAUNCHED and not topology.launched_externally():
            return devices
        return 1

    def replicas(self, backend: LightningBackendConfig, device: str) -> tuple[int, int, int]:
        """Replicas per node, nodes, replicas per process: one-replica processes, one per device of a node."""
        devices = node_devices(backend)
        return devices, backend.num_nodes, 1

    def newest_checkpoint(self, checkpoint_dir: Path) -> Path | None:
        """This run dir's newest checkpoint, if there is one."""
        return newest_checkpoint(checkpoint_dir)

    def checkpoint_epochs(self, path: Path) -> int:
        """How many whole epochs a Lightning checkpoint holds; one line if it cannot be read as one."""
        try:
            state = read_lazily(path)
            epochs = epochs_of(state)
            state["state_dict"]
        except Exception as err:  # torch raises many types for a file that is not a checkpoint
            raise HydraliError(
                f"ckpt_path={path} cannot be read as a Lightning checkpoint ({first_line(err)}): "
                f"pass a .ckpt file that hydrali wrote, or ckpt_path=last"
            ) from err
        return epochs

    def load_trained(self, *, run: TrainedRunSpec, task, dataset, checkpoint: Path):
        """The run's torch side with the weights of a Lightning checkpoint, for inference (at backend.precision,
        through Lightning's precision plugin)."""
        from hydrali.backends.torch.trained import load_trained

        precision = functools.partial(precision_plugin, run.precision)
        return load_trained(
            run=run, task=task, dataset=dataset, checkpoint=checkpoint, precision=precision, backend=SPEC.name
        )

    def training_probe(self, *, contract: RunContract, task, dataset):
        """The run's network and optimizer, trained apart by a plain loop (backends/lightning/probe.py)."""
        from hydrali.backends.lightning.probe import LightningProbe

        return LightningProbe(contract=contract, task=task, dataset=dataset)

    def share_from_rank0(self, values: dict, plan: Plan) -> dict:
        """Rank 0's `values` on every process that torchrun, srun or MPI started (torch.distributed's store)."""
        return agreement.share_from_rank0(values, plan)

    def fit(
        self,
        *,
        contract: RunContract,
        task,
        dataset,
        record: RunRecord,
        resume_from: Path | None,
        output_dir: Path,
        preemption: PreemptionWatch | None = None,
    ) -> FitResult:
        """Train `task` on this process's shard as the contract says; checkpoint, record and resume through
        Lightning (mid-epoch included); save and stop on a signal `preemption` notes."""
        _quiet_duplicate_logs()
        plan, settings = contract.plan, contract.backend
        seed_torch(plan.seed, contract.deterministic)
        checkpoint_dir = output_dir / CHECKPOINT_DIR
        if resume_from is not None and plan.global_rank == 0:  # the files after the checkpoint resumed from go
            drop_later(checkpoint_dir, self.checkpoint_epochs(resume_from))
        datamodule = DaliDataModule(task=task, contract=contract, dataset=dataset)
        datamodule.setup("fit")
        show_bar = contract.progress_bar
        side = build_torch_side(
            task, dataset, model=contract.task_inputs.model, image_size=contract.image_size, backend=SPEC.name
        )
        start = weights_from_run.find(contract.start_weights, SPEC.name, newest_checkpoint) if not resume_from else None
        if start is not None:  # model.weights names an earlier run (a resumed run has its own weights)
            start_side_from(side, start, str(contract.start_weights))
        module = HydraliModule(
            side,
            contract.optim,
            plan,
            plan.epoch.optimizer_steps,
            channels_last=settings.channels_last,
            step_loss_in_bar=show_bar,
            training_size=contract.training_size if contract.train_sizes else None,
        )
        if plan.global_rank == 0:
            trainable = sum(p.numel() for p in module.torch_task.parameters() if p.requires_grad)
            log.info("%s", model_line(contract.network, trainable))
        if contract.compile:  # before the strategy wraps the module (DDP), as Lightning advises
            compile_torch_side(module.torch_task, settings)
            log.info(
                "backend.compile=true: torch.compile (mode %s); the first step includes its warm-up",
                settings.compile_mode,
            )

        # every epoch the contract saves, each file kept until core's retention prunes it (LastCheckpoint does)
        checkpoint = EpochNumberCheckpoint(
            saves=contract.saves_checkpoint,
            dirpath=checkpoint_dir,
            filename=EPOCH_FILE,
            monitor=None,
            save_top_k=-1,
            auto_insert_metric_name=False,
            save_on_train_epoch_end=True,  # after the epoch's validation, the state last.ckpt holds: one file for both
        )
        # last.ckpt after every epoch that saves: a second name of the epoch's file; then keep_checkpoints' pruning
        last = LastCheckpoint(
            saves=contract.saves_checkpoint,
            epoch_file=checkpoint,
            prune=functools.partial(
                prune_epoch_files, checkpoint_dir, record, contract.keep_checkpoints, contract.monitor, contract.mode
            ),
            dirpath=checkpoint_dir,
            filename=Path(LAST).stem,
            save_top_k=1,
            monitor=None,
            save_on_train_epoch_end=True,
            enable_version_counter=False,
        )
        observer = TrainingObserver(
            record,
            images_per_batch=plan.images_per_batch,
            steps_per_epoch=plan.epoch.train_steps,
            warmup_steps=contract.throughput_warmup_steps,
        )
        train_loader = datamodule.loaders["train"]
        resumable = isinstance(train_loader, ResumableDaliLoader)
        reader_position = [ReaderPosition(train_loader, plan.global_rank)] if resumable else []
        stop_on_signal = [StopOnSignal(preemption, checkpoint_dir / LAST, resumable)] if preemption is not None else []
        trainer = L.Trainer(
            max_epochs=plan.epochs,
            accelerator=settings.accelerator,
            devices=node_devices(settings),
            num_nodes=settings.num_nodes,
            strategy=training_strategy(settings),
            precision=contract.precision,
            deterministic=contract.deterministic,
            logger=False,
            default_root_dir=str(output_dir),
            enable_progress_bar=show_bar,
            # validate_every (which a callback such as EarlyStopping reads when set up); ValidationEpochs then decides
            # each epoch's, the last epoch's included
            check_val_every_n_epoch=contract.validate_every,
            accumulate_grad_batches=plan.accumulate,  # an epoch is a whole number of accumulations (core.run.epoch)
            callbacks=[
                *reader_position,  # first: the checkpoints below save DALI's state after the batches trained
                checkpoint,
                last,
                Observe(observer),
                ValidationEpochs(contract.validates),
                *stop_on_signal,  # after the step was observed
                *([progress_bar()] if show_bar else []),
                *contract.callbacks,
            ],
            **settings.trainer,
        )
        gather.install(all_gather_bytes)  # a task's validation gathers across the DDP processes through it
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
        except RuntimeError as err:
            if resume_from and "Error(s) in loading state_dict" in str(err):
                raise HydraliError(
                    f"ckpt_path={resume_from} holds the weights of another model "
                    f"({str(err).splitlines()[-1].strip()}): resume with the model it was trained with"
                ) from err
            raise
        except SystemExit:
            if not trainer.interrupted:
                raise
            # Lightning ends a Ctrl+C with sys.exit(1) and leaves SIGINT ignored: restore both, so that an
            # interruption ends the same way on every backend (core: the run KILLED, exit code 130)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt from None

        best = best_epoch_file(checkpoint_dir, record, contract.monitor, contract.mode)
        return FitResult(
            best_checkpoint=None if best is None else str(best),
            **observer.fit_fields(start_epoch=trainer.current_epoch),
            compiled=contract.compile,
        )
