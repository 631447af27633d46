"""Training a task with Keras 3 on TensorFlow: the `fit` that hydrali.core.run.runner calls for backend=keras."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import keras
from hydra.errors import InstantiationException
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig

from hydrali.backends.keras import checkpoints, workers
from hydrali.backends.keras.callbacks import EpochRecorder, Throughput
from hydrali.backends.keras.data import LAYOUT, dali_dataset, distribute  # noqa: F401 (LAYOUT: core.data.autotune's)
from hydrali.backends.keras.strategy import configure_devices, make_strategy, placement, visible_gpus  # noqa: F401
from hydrali.backends.keras.training import ValidationPosition, compile_model
from hydrali.core.run.checkpoints import CHECKPOINT_DIR
from hydrali.core.data.dali_errors import explain_dali_error
from hydrali.core.errors import HydraliError
from hydrali.core.run.plan import Plan
from hydrali.core.run.record import RunRecord
from hydrali.core.run.results import FitResult

log = logging.getLogger("hydrali")
logging.getLogger("tensorflow").setLevel(logging.WARNING)  # per-variable all-reduce notices
FRAMEWORK = "TensorFlow"
newest_checkpoint = checkpoints.newest
checkpoint_epochs = checkpoints.epochs_in


def processes_to_start(backend: DictConfig) -> int:
    """One: a Keras job is one process driving every replica of its machine."""
    return 1


def replicas(backend: DictConfig, device: str) -> tuple[int, int, int]:
    """Replicas per node, nodes, replicas per process: one process drives every replica of its node
    (the GPUs TensorFlow sees, or `backend.replicas` logical CPUs on a machine without one); TF_CONFIG
    workers drive one replica each, every worker counted as a node."""
    gpus = visible_gpus()
    cluster = workers.cluster()
    if cluster is not None:
        workers.one_replica_per_worker(backend.replicas, gpus)
        per_node, nodes = workers.slurm_tasks() or (1, cluster.count)   # SLURM: its tasks; TF_CONFIG: a node each
        if gpus and per_node > 1 and gpus != per_node:   # task i of a node takes the node's GPU i
            raise HydraliError(f"{per_node} SLURM tasks per node but this task sees {gpus} GPU(s): start one task per "
                               f"GPU of the node, each seeing all of them (no per-task GPU binding)")
        return per_node, nodes, 1
    count = backend.replicas if backend.replicas is not None else max(1, gpus)
    if count < 1:
        raise HydraliError(f"backend.replicas={count}: it needs at least 1 (or null for every visible GPU)")
    if gpus and count > gpus:
        raise HydraliError(f"backend.replicas={count} but TensorFlow sees only {gpus} GPU(s): lower backend.replicas")
    if device == "gpu" and not gpus:
        raise HydraliError("DALI runs on the GPU but TensorFlow sees none: install TensorFlow with CUDA "
                           "(tensorflow[and-cuda]) or set pipeline.device=cpu")
    return count, 1, count


def _devices(plan: Plan) -> list[str]:
    """This process's replica devices, made available (a SLURM task first picks its GPU)."""
    workers.select_gpu(plan.local_rank)
    return configure_devices(len(plan.shards), "gpu" if visible_gpus() else "cpu")


def share_from_rank0(values: dict, plan: Plan) -> dict:
    """Rank 0's `values` (JSON-able) on every Keras worker (TF_CONFIG's or SLURM's), through the job's
    MultiWorkerMirroredStrategy (created here: it must exist before TensorFlow runs its first op)."""
    _devices(plan)
    return workers.share_from_rank0(values, "gpu" if visible_gpus() else "cpu")


def _keras_task(task, dataset):
    try:
        return get_method(task.keras_target)(task, dataset)
    except Exception as err:
        raise HydraliError(f"task.keras_target={task.keras_target} cannot be built: {err}") from err


def _compile(cfg: DictConfig, framework, strategy, dataset, plan: Plan):
    def network():
        try:
            return framework.build_model(cfg.model, dataset.num_classes, cfg.data.image_size)
        except (InstantiationException, TypeError, ValueError) as err:
            raise HydraliError(f"model={cfg.model.get('_target_')} cannot be built on Keras: {err}") from err

    try:
        return compile_model(strategy=strategy, build_network=network, loss=framework.loss(),
                             metrics=framework.metrics(), optim=cfg.optim, plan=plan, contract=plan.epoch,
                             precision=str(cfg.backend.precision), jit_compile=cfg.backend.compile,
                             on_val_batch=framework.on_val_batch)
    except (InstantiationException, TypeError, ValueError) as err:
        raise HydraliError(f"the Keras optimizer or loss cannot be set up (optim={cfg.optim.name}, "
                           f"backend.precision={cfg.backend.precision}): {err}") from err


def _verbosity(verbose):
    """Keras' `verbose`: `auto` is a progress bar on a terminal and nothing otherwise (the run log has one line
    per epoch either way)."""
    return (1 if sys.stdout.isatty() else 0) if verbose == "auto" else verbose


def fit(*, cfg: DictConfig, task, dataset, plan: Plan, record: RunRecord, resume_from: Path | None,
        output_dir: Path) -> FitResult:
    """Train `task` with one replica per shard of this process, as the plan says; checkpoint every epoch."""
    checkpoint_dir = output_dir / CHECKPOINT_DIR
    chief = plan.global_rank == 0   # the one writer among TF_CONFIG workers (the only process otherwise)
    initial_epoch = checkpoints.epochs_done(resume_from) if resume_from is not None else 0
    if resume_from is not None and chief:
        checkpoints.drop_later(checkpoint_dir, initial_epoch)
    keras.utils.set_random_seed(plan.seed)
    if cfg.deterministic:
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()

    devices = _devices(plan)
    strategy = make_strategy(devices)
    framework = _keras_task(task, dataset)
    contract = plan.epoch

    def datasets(is_training: bool):
        return distribute(strategy, devices, plan.device, lambda replica: dali_dataset(
            task=task, cfg=cfg, dataset=dataset, plan=plan, replica=replica, is_training=is_training))

    with placement(devices):  # one replica: the model sits where it computes
        model = _compile(cfg, framework, strategy, dataset, plan)
        if cfg.backend.compile:
            if model.jit_compile:
                log.info("backend.compile=true: XLA (jit_compile); the first step includes its warm-up")
            else:
                log.warning("backend.compile=true but Keras runs this model without XLA (deterministic=true, or a "
                            "layer that XLA cannot compile)")
        if resume_from is not None:
            try:
                model.load_weights(resume_from)
            except Exception as err:
                raise HydraliError(f"ckpt_path={resume_from} does not fit this model and optimizer: {err}") from err
            log.info("resuming from %s at epoch %d", resume_from, initial_epoch + 1)

        recorder = EpochRecorder(record, contract.train_steps)
        throughput = Throughput(cfg.throughput_warmup_steps, plan.global_batch)
        callbacks = [
            *framework.callbacks(),   # first: the task's validation metrics join the epoch's logs
            keras.callbacks.ModelCheckpoint(str(checkpoint_dir / checkpoints.PATTERN), save_weights_only=True)
            if chief else workers.ThrowawayCheckpoint(),   # every worker saves, at the same point
            recorder,   # before the pruning, which keeps the best epoch of the record
            *([checkpoints.PruneCheckpoints(checkpoint_dir, cfg.backend.keep_checkpoints, record, cfg.task.monitor,
                                            str(cfg.task.mode)),
               keras.callbacks.TensorBoard(log_dir=str(output_dir / "tensorboard"))] if chief else []),
            ValidationPosition(), throughput, *(instantiate(spec) for spec in cfg.backend.callbacks.values()),
        ]
        try:
            model.fit(datasets(True), epochs=cfg.epochs, initial_epoch=initial_epoch,
                      steps_per_epoch=contract.train_steps, validation_data=datasets(False),
                      validation_steps=contract.val_steps, validation_freq=cfg.backend.validation_freq,
                      callbacks=callbacks, verbose=_verbosity(cfg.backend.verbose), shuffle=False)  # DALI shuffles
        except Exception as err:
            if "dali" in type(err).__name__.lower() or "DALI" in str(err) or "nvidia.dali" in str(err):
                raise explain_dali_error(err, lambda: task.explain_decode_error(dataset)) from err
            raise

        best = record.best(cfg.task.monitor, str(cfg.task.mode))
        best_file = checkpoints.file_of(checkpoint_dir, best["epoch"]) if best else None
        return FitResult(best_checkpoint=str(best_file) if best_file and best_file.exists() else None,
                         first_epoch=recorder.first_epoch if recorder.first_epoch is not None else initial_epoch,
                         epochs_completed=record.rows[-1]["epoch"] + 1 if record.rows else initial_epoch,
                         **throughput.clock.fit_fields(), compiled=bool(model.jit_compile))
