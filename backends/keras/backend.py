"""Training a task with Keras 3 on TensorFlow: the `fit` that hydrali.core.run.runner calls for backend=keras."""

from __future__ import annotations

import logging
from pathlib import Path

from hydrali.backends.keras import xla_cache
from hydrali.backends.keras.quiet_start import import_tensorflow
from hydrali.backends.keras.spec import SPEC, KerasBackendConfig

xla_cache.name_process_folder()  # before TensorFlow reads its flags
import_tensorflow()  # first, so that no other import starts TensorFlow with its chatter

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from hydrali.backends.keras import checkpoints, cpu_bfloat16, workers  # noqa: E402
from hydrali.backends.keras.callbacks import (  # noqa: E402
    AverageInCheckpoints,
    KeepAverageAfterFit,
    Observe,
    StopOnSignal,
)
from hydrali.backends.keras.compiled import compile_task_model  # noqa: E402
from hydrali.backends.keras.data import LAYOUT, dali_dataset, distribute  # noqa: E402
from hydrali.backends.keras.model import ValidationPosition  # noqa: E402
from hydrali.backends.keras.resizing import TrainingSizes  # noqa: E402
from hydrali.backends.keras.side import build_keras_side  # noqa: E402
from hydrali.backends.keras.strategy import (  # noqa: E402
    make_strategy,
    placement,
    replica_devices,
    training_device,
    use_cpu_threads,
    visible_gpus,
)
from hydrali.core.contracts.backend import TrainingDevice  # noqa: E402
from hydrali.core.contracts.run import RunContract, TrainedRunSpec  # noqa: E402
from hydrali.core.data.dali_errors import explain_dali_error  # noqa: E402
from hydrali.core.distributed import topology  # noqa: E402
from hydrali.core.distributed.device_count import devices_per_node  # noqa: E402
from hydrali.core.errors import HydraliError  # noqa: E402
from hydrali.core.process.preemption import PreemptionWatch  # noqa: E402
from hydrali.core.run import weights_from_run  # noqa: E402
from hydrali.core.run.checkpoints import CHECKPOINT_DIR  # noqa: E402
from hydrali.core.run.observer import TrainingObserver  # noqa: E402
from hydrali.core.run.plan import Plan  # noqa: E402
from hydrali.core.run.record import RunRecord  # noqa: E402
from hydrali.core.run.results import FitResult  # noqa: E402
from hydrali.core.run.summary import model_line  # noqa: E402

log = logging.getLogger("hydrali")
logging.getLogger("tensorflow").setLevel(logging.WARNING)  # per-variable all-reduce notices


def _per_device(backend: KerasBackendConfig) -> bool:
    """Whether backend.processes asks for a process per device."""
    choice = str(backend.processes)
    if choice not in ("one", "per_device"):
        raise HydraliError(f"backend.processes={choice}: choose one or per_device")
    return choice == "per_device"


class KerasBackend:
    """backend=keras (core.contracts.backend.Backend): one process drives every replica of its machine."""

    layout = LAYOUT

    def processes_to_start(self, backend: KerasBackendConfig) -> int:
        """One process driving every replica of its machine, or with backend.processes=per_device one per device
        (each a worker of MultiWorkerMirroredStrategy), unless a launcher or TF_CONFIG started the workers."""
        if _per_device(backend) and workers.cluster() is None and not topology.launched_externally():
            return devices_per_node(backend.devices, visible_gpus())
        return 1

    def replicas(self, backend: KerasBackendConfig, device: str) -> tuple[int, int, int]:
        """Replicas per node, nodes, replicas per process: one process drives the replicas of its node, one per
        device that backend.devices names (hydrali.core.distributed.device_count: `auto` is every GPU TensorFlow
        sees; on a machine without one, N logical CPUs); TF_CONFIG workers drive one replica each, every worker
        counted as a node."""
        gpus = visible_gpus()
        if not gpus and str(backend.precision) == "bf16-mixed":  # on the CPU: asked of TensorFlow before any file
            cpu_bfloat16.check_bfloat16_convolution()
        cluster = workers.cluster()
        if cluster is not None:  # SLURM: its tasks; hydrali's processes: one node; TF_CONFIG: a node each
            local = workers.local_workers()
            per_node, nodes = (local, cluster.count // local) if local else (1, cluster.count)
            workers.one_replica_per_worker(backend.devices, per_node, gpus)
            if gpus and per_node > 1 and gpus != per_node:  # task i of a node takes the node's GPU i
                raise HydraliError(
                    f"{per_node} SLURM tasks per node but this task sees {gpus} GPU(s): start one task per "
                    f"GPU of the node, each seeing all of them (no per-task GPU binding)"
                )
            return per_node, nodes, 1
        count = devices_per_node(backend.devices, gpus)
        if _per_device(backend) and not topology.launched_externally():  # the processes hydrali starts
            return count, 1, 1
        if device == "gpu" and not gpus:
            raise HydraliError(
                "DALI runs on the GPU but TensorFlow sees none: install TensorFlow with CUDA "
                "(tensorflow[and-cuda]) or set pipeline.device=cpu"
            )
        return count, 1, count

    def training_probe(self, *, contract: RunContract, task, dataset):
        """The run's compiled model, trained apart by a plain loop (backends/keras/probe.py)."""
        from hydrali.backends.keras.probe import KerasProbe

        return KerasProbe(contract=contract, task=task, dataset=dataset)

    def load_trained(self, *, run: TrainedRunSpec, task, dataset, checkpoint: Path):
        """The run's network with the weights of a Keras checkpoint, for inference."""
        from hydrali.backends.keras.trained import load_trained

        return load_trained(run=run, task=task, dataset=dataset, checkpoint=checkpoint)

    def share_from_rank0(self, values: dict, plan: Plan) -> dict:
        """Rank 0's `values` (JSON-able) on every Keras worker (TF_CONFIG's or SLURM's), through the job's
        MultiWorkerMirroredStrategy (created here: it must exist before TensorFlow runs its first op)."""
        replica_devices(plan)
        return workers.share_from_rank0(values, "gpu" if visible_gpus() else "cpu")

    def visible_gpus(self) -> int:
        """The number of GPUs TensorFlow sees."""
        return visible_gpus()

    def use_cpu_threads(self, threads: int) -> None:
        """TensorFlow's intra-op threads (core's cpu_threads)."""
        use_cpu_threads(threads)

    def training_device(self, backend: KerasBackendConfig) -> TrainingDevice:
        """The first GPU TensorFlow sees (the replicas train on its GPUs when it sees any), or the CPU."""
        return training_device()

    def newest_checkpoint(self, checkpoint_dir: Path) -> Path | None:
        """The newest per-epoch checkpoint in `checkpoint_dir`, if there is one."""
        return checkpoints.newest(checkpoint_dir)

    def checkpoint_epochs(self, path: Path) -> int:
        """How many epochs a Keras checkpoint holds; one line if it cannot be read as one."""
        return checkpoints.epochs_in(path)

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
        """Train `task` with one replica per shard of this process, as the plan says; checkpoint every epoch; stop
        on a signal `preemption` notes (resumed from the last epoch's end)."""
        plan, settings = contract.plan, contract.backend
        checkpoint_dir = output_dir / CHECKPOINT_DIR
        chief = plan.global_rank == 0  # the one writer among TF_CONFIG workers (the only process otherwise)
        initial_epoch = checkpoints.epochs_done(resume_from) if resume_from is not None else 0
        if resume_from is not None and chief:
            checkpoints.drop_later(checkpoint_dir, initial_epoch)
        keras.utils.set_random_seed(plan.seed)
        if contract.deterministic:
            tf.config.experimental.enable_op_determinism()

        devices = replica_devices(plan)
        strategy = make_strategy(devices)
        side = build_keras_side(task, dataset)
        epoch = plan.epoch

        def datasets(is_training: bool):
            return distribute(
                strategy,
                devices,
                plan.device,
                lambda replica: dali_dataset(
                    task=task, contract=contract, dataset=dataset, replica=replica, is_training=is_training
                ),
            )

        with placement(devices):  # one replica: the model sits where it computes
            start = (
                None if resume_from else weights_from_run.find(contract.start_weights, SPEC.name, checkpoints.newest)
            )
            model = compile_task_model(contract=contract, side=side, strategy=strategy, dataset=dataset, start=start)
            if chief:
                trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
                log.info("%s", model_line(contract.network, trainable))
            if contract.compile:
                if model.jit_compile:
                    log.info("backend.compile=true: XLA (jit_compile); the first step includes its warm-up")
                else:
                    log.warning(
                        "backend.compile=true but Keras runs this model without XLA (deterministic=true, or a "
                        "layer that XLA cannot compile)"
                    )
            if resume_from is not None:
                try:
                    model.load_weights(resume_from)
                except Exception as err:
                    raise HydraliError(f"ckpt_path={resume_from} does not fit this model and optimizer: {err}") from err
                log.info("resuming from %s at epoch %d", resume_from, initial_epoch + 1)

            # TF_CONFIG workers do not agree on a step to stop at: one stopping alone would leave the others waiting
            # in their all-reduce, so they train on and the requeued job resumes from the last epoch's end
            stops_on_signal = preemption is not None and workers.cluster() is None
            if preemption is not None and not stops_on_signal and chief:
                log.info(
                    "preemption: Keras workers do not stop on a signal; a requeued job resumes from its last epoch"
                )
            observer = TrainingObserver(
                record,
                images_per_batch=plan.images_per_batch,
                steps_per_epoch=epoch.train_steps,
                warmup_steps=contract.throughput_warmup_steps,
            )
            average = (
                [AverageInCheckpoints(resumed=resume_from is not None)] if contract.optim.ema_decay is not None else []
            )
            callbacks = [
                *side.callbacks(),  # first: the task's validation metrics join the epoch's logs
                *average,  # before the checkpoint: it saves the average as the network's weights
                checkpoints.EpochCheckpoint(str(checkpoint_dir / checkpoints.PATTERN), contract.saves_checkpoint)
                if chief
                else workers.ThrowawayCheckpoint(contract.saves_checkpoint),  # every worker saves, at the same point
                *([KeepAverageAfterFit()] if average else []),  # after it: the last checkpoint keeps the live weights
                Observe(observer),  # before the pruning, which keeps the best epoch of the record
                *(
                    [
                        checkpoints.PruneCheckpoints(
                            checkpoint_dir, contract.keep_checkpoints, record, contract.monitor, contract.mode
                        ),
                        keras.callbacks.TensorBoard(log_dir=str(output_dir / "tensorboard")),
                    ]
                    if chief
                    else []
                ),
                ValidationPosition(),
                *([TrainingSizes(contract.training_size)] if contract.train_sizes else []),  # progressive_resizing
                *([StopOnSignal(preemption, checkpoint_dir)] if stops_on_signal else []),
                *contract.callbacks,
            ]
            kept = settings.xla_cache if model.jit_compile else None  # XLA's compiled steps of earlier runs
            label = xla_cache.device_label(tf.config.list_physical_devices("GPU"), tf.__version__) if kept else ""
            try:
                with xla_cache.kept_compiles(kept, label, publishes=chief):
                    model.fit(
                        datasets(True),
                        epochs=plan.epochs,
                        initial_epoch=initial_epoch,
                        steps_per_epoch=epoch.train_steps,
                        validation_data=datasets(False),
                        validation_steps=epoch.val_steps,
                        validation_freq=contract.validation_epochs(),  # every validate_every-th and the last
                        callbacks=callbacks,
                        verbose=1 if contract.progress_bar else 0,  # the run log has a line per epoch either way
                        shuffle=False,
                    )  # DALI shuffles
            except Exception as err:
                if "dali" in type(err).__name__.lower() or "DALI" in str(err) or "nvidia.dali" in str(err):
                    raise explain_dali_error(err, lambda: task.explain_decode_error(dataset)) from err
                raise

            best_file = checkpoints.best_saved(checkpoint_dir, record, contract.monitor, contract.mode)
            return FitResult(
                best_checkpoint=str(best_file) if best_file and best_file.exists() else None,
                **observer.fit_fields(start_epoch=initial_epoch),
                compiled=bool(model.jit_compile),
            )
