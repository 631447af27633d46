"""Training a task with Keras 3 on TensorFlow: the `fit` that core.runner calls for backend=keras."""
from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
from hydra.errors import InstantiationException  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from backends.keras import checkpoints  # noqa: E402
from backends.keras.callbacks import EpochRecorder, Throughput  # noqa: E402
from backends.keras.data import (  # noqa: E402
    check_shards_hold_a_batch, dali_dataset, distribute, reader_epoch_size, steps_per_epoch)
from backends.keras.strategy import configure_devices, make_strategy, placement, visible_gpus  # noqa: E402
from backends.keras.training import compile_model  # noqa: E402
from core.errors import HydraliError  # noqa: E402
from core.plan import Plan  # noqa: E402
from core.results import FitResult  # noqa: E402

log = logging.getLogger("hydrali")
logging.getLogger("tensorflow").setLevel(logging.WARNING)  # per-variable all-reduce notices


def replicas(backend: DictConfig, device: str) -> tuple[int, int, int]:
    """Replicas per node, nodes, replicas per process: one process drives every replica of its node."""
    count = backend.replicas
    if count is None:
        count = max(1, visible_gpus()) if device == "gpu" else 1
    if count < 1:
        raise HydraliError(f"backend.replicas={count}: it needs at least 1 (or null for every visible GPU)")
    if device == "gpu" and count > visible_gpus():
        raise HydraliError(f"backend.replicas={count} but only {visible_gpus()} GPU(s) are visible: "
                           f"lower backend.replicas (or use pipeline.device=cpu for logical CPU replicas)")
    return count, 1, count


def _keras_task(task):
    return importlib.import_module(f"{task.package}.keras_task")


def fit(*, cfg: DictConfig, task, dataset, plan: Plan, tracker, output_dir: Path) -> FitResult:
    """Train `task` with one replica per shard of this process, as the plan says; checkpoint every epoch."""
    checkpoint_dir = output_dir / checkpoints.CHECKPOINT_DIR
    resume_from = checkpoints.resolve(cfg.ckpt_path, checkpoint_dir)
    keras.utils.set_random_seed(plan.seed)
    if cfg.deterministic:
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()

    devices = configure_devices(len(plan.shards), plan.device)
    strategy = make_strategy(devices)
    framework = _keras_task(task)
    sizes = {split: reader_epoch_size(task=task, cfg=cfg, dataset=dataset, plan=plan, is_training=split == "train")
             for split in ("train", "val")}
    for split, count in sizes.items():
        check_shards_hold_a_batch(count, plan, split)
    train_steps = steps_per_epoch(sizes["train"], plan.num_shards, plan.per_replica_batch)
    val_steps = steps_per_epoch(sizes["val"], plan.num_shards, plan.per_replica_batch)

    def datasets(is_training: bool):
        return distribute(strategy, devices, lambda replica: dali_dataset(
            task=task, cfg=cfg, dataset=dataset, plan=plan, replica=replica, is_training=is_training,
            labels_shape=framework.labels_shape()))

    with placement(devices):  # one replica: the model sits where its dataset is
        try:
            model = compile_model(
                strategy=strategy,
                build_network=lambda: framework.build_model(cfg.model, dataset.num_classes, cfg.data.image_size),
                loss=framework.loss(task), metrics=framework.metrics(task), optim=cfg.optim, plan=plan,
                steps_per_epoch=train_steps, jit_compile=cfg.backend.jit_compile)
        except (InstantiationException, TypeError, ValueError) as err:
            raise HydraliError(f"model={cfg.model.get('_target_')} cannot be built on Keras: {err}") from err

        initial_epoch = 0
        if resume_from is not None:
            try:
                model.load_weights(resume_from)
            except Exception as err:
                raise HydraliError(f"ckpt_path={resume_from} does not fit this model and optimizer: {err}") from err
            initial_epoch = checkpoints.epochs_done(resume_from)
            log.info("resuming from %s at epoch %d", resume_from, initial_epoch + 1)

        recorder, throughput = EpochRecorder(tracker), Throughput(plan.global_batch)
        callbacks = [
            keras.callbacks.ModelCheckpoint(str(checkpoint_dir / checkpoints.PATTERN), save_weights_only=True),
            checkpoints.PruneCheckpoints(checkpoint_dir, cfg.backend.keep_checkpoints, cfg.task.monitor, str(cfg.task.mode)),
            keras.callbacks.TensorBoard(log_dir=str(output_dir / "tensorboard")),
            recorder, throughput, *(instantiate(spec) for spec in cfg.backend.callbacks.values()),
        ]
        model.fit(datasets(True), epochs=cfg.epochs, initial_epoch=initial_epoch, steps_per_epoch=train_steps,
                  validation_data=datasets(False), validation_steps=val_steps,
                  validation_freq=cfg.backend.validation_freq, callbacks=callbacks, verbose=cfg.backend.verbose,
                  shuffle=False)  # DALI shuffles

        best = _best_checkpoint(recorder.history, cfg.task.monitor, str(cfg.task.mode), checkpoint_dir)
        return FitResult(history=recorder.history, best_checkpoint=best,
                         first_epoch=recorder.first_epoch if recorder.first_epoch is not None else initial_epoch,
                         epochs_completed=initial_epoch + len(recorder.history),
                         train_images=throughput.images, train_seconds=throughput.seconds)


def _best_checkpoint(history: list[dict], monitor: str, mode: str, checkpoint_dir: Path) -> str | None:
    scored = [row for row in history if monitor in row]
    if not scored:
        return None
    pick = max if mode == "max" else min
    best = pick(scored, key=lambda row: row[monitor])
    path = checkpoint_dir / checkpoints.PATTERN.format(epoch=best["epoch"] + 1)
    return str(path) if path.exists() else None
