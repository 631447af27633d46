"""Training a task with PyTorch Lightning: the `fit` that core.runner calls for backend=lightning."""
from __future__ import annotations

import importlib
import logging
import os
import warnings
from pathlib import Path

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from backends.lightning.callbacks import EpochRecorder, Throughput
from backends.lightning.data import DaliDataModule
from backends.lightning.module import HydraliModule
from core.errors import HydraliError
from core.plan import Plan
from core.results import FitResult

log = logging.getLogger("hydrali")
# Noise from inside Lightning that a user can do nothing about.
warnings.filterwarnings("ignore", message=".*isinstance\(treespec, LeafSpec\).*")
CHECKPOINT_DIR = "checkpoints"
LAST = "last.ckpt"


def replicas(backend: DictConfig, device: str) -> tuple[int, int, int]:
    """Replicas per node, nodes, replicas per process: backend.devices one-replica processes per node."""
    if device == "cpu" and backend.devices > 1 and backend.accelerator != "cpu":
        raise HydraliError(f"backend.devices={backend.devices} needs {backend.devices} GPUs but the pipeline runs "
                           f"on the CPU: set backend.devices=1 (or backend.accelerator=cpu for CPU processes)")
    if backend.devices > 1 and _in_sweep() and not _launched_externally():
        raise HydraliError(
            f"-m with backend.devices={backend.devices} is not supported: Lightning's launcher would restart "
            f"the whole sweep in every process (Lightning issue 11300). Run the jobs one by one, or start "
            f"the processes with torchrun or srun")
    return backend.devices, backend.num_nodes, 1


def _in_sweep() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _launched_externally() -> bool:
    """Whether torchrun or SLURM started this process (then Lightning starts no processes itself)."""
    return any(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "SLURM_PROCID", "LOCAL_RANK"))


def resolve_ckpt_path(ckpt_path: str | None, checkpoint_dir: Path) -> str | None:
    """The checkpoint to resume from: None, this run dir's last.ckpt for "last", or an existing file."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        last = checkpoint_dir / LAST
        if not last.exists():
            raise HydraliError(f"ckpt_path=last but {last} does not exist: pass hydra.run.dir=<the interrupted "
                               f"run's output dir> or ckpt_path=<path to a .ckpt file>")
        return str(last)
    path = Path(ckpt_path)
    if not path.is_file():
        raise HydraliError(f"ckpt_path={ckpt_path} is not a file: pass an existing .ckpt file or ckpt_path=last")
    if path.suffix != ".ckpt":
        raise HydraliError(f"ckpt_path={ckpt_path} is not a Lightning checkpoint (.ckpt): "
                           f"a checkpoint of another backend cannot be resumed here")
    return str(path)


def _torch_task(task, cfg: DictConfig, num_classes: int):
    framework = importlib.import_module(f"{task.package}.torch_task")
    try:
        return framework.build(task, cfg.model, num_classes)
    except (InstantiationException, TypeError, ValueError) as err:
        raise HydraliError(f"model={cfg.model.get('_target_')} cannot be built: {err}") from err


def _extra_callbacks(cfg: DictConfig) -> list[L.Callback]:
    return [instantiate(spec) for spec in cfg.backend.callbacks.values()]


def fit(*, cfg: DictConfig, task, dataset, plan: Plan, tracker, output_dir: Path) -> FitResult:
    """Train `task` on this process's shard as the plan says; checkpoint, log and resume through Lightning."""
    checkpoint_dir = output_dir / CHECKPOINT_DIR
    resume_from = resolve_ckpt_path(cfg.ckpt_path, checkpoint_dir)
    datamodule = DaliDataModule(task=task, cfg=cfg, dataset=dataset, plan=plan)
    datamodule.setup("fit")
    steps_per_epoch = len(datamodule.train_dataloader()) // cfg.backend.trainer.get("accumulate_grad_batches", 1)
    module = HydraliModule(_torch_task(task, cfg, dataset.num_classes), cfg.optim, plan, max(1, steps_per_epoch),
                           channels_last=cfg.backend.channels_last)

    checkpoint = ModelCheckpoint(dirpath=checkpoint_dir, filename="epoch{epoch:03d}", monitor=cfg.task.monitor,
                                 mode=str(cfg.task.mode), save_top_k=cfg.backend.save_top_k, save_last=True,
                                 auto_insert_metric_name=False)
    recorder, throughput = EpochRecorder(tracker), Throughput()
    trainer = L.Trainer(
        max_epochs=cfg.epochs, accelerator="cpu" if plan.device == "cpu" else cfg.backend.accelerator,
        devices=cfg.backend.devices, num_nodes=cfg.backend.num_nodes, strategy=cfg.backend.strategy,
        precision=cfg.backend.precision, deterministic=cfg.deterministic, logger=False,
        default_root_dir=str(output_dir), callbacks=[checkpoint, recorder, throughput, *_extra_callbacks(cfg)],
        **OmegaConf.to_container(cfg.backend.trainer, resolve=True))
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)

    best = checkpoint.best_model_path or checkpoint.last_model_path or None
    return FitResult(history=recorder.history, best_checkpoint=best,
                     first_epoch=recorder.first_epoch if recorder.first_epoch is not None else trainer.current_epoch,
                     epochs_completed=trainer.current_epoch, train_images=throughput.images,
                     train_seconds=throughput.seconds)
