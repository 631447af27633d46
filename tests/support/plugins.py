"""What the tests plug into hydrali as a user would, through `_target_` strings (`tests.support.plugins.<name>`):
callbacks (`+backend.callbacks.<key>={_target_: ...}`) that press Ctrl+C or record what the frameworks, and DALI
through them, really did (torch's seed, the labels trained on, dtype policies, compiled graphs, DALI's threads), and
model builders (`model._target_`, `model.keras_target`). Each imports its framework only when it is built."""


class InterruptAtEpoch:
    """Press Ctrl+C (raise KeyboardInterrupt) when epoch `epoch` (0-based) starts, on Lightning, in a run that trained
    an earlier epoch (so that the same run resumed as it was goes on)."""

    def __new__(cls, epoch: int):
        import lightning as L

        class _Interrupt(L.Callback):
            first: int | None = None

            def on_train_epoch_start(self, trainer, pl_module) -> None:
                self.first = trainer.current_epoch if self.first is None else self.first
                if trainer.current_epoch == epoch and self.first < epoch:
                    raise KeyboardInterrupt

        return _Interrupt()


class KerasInterruptAtEpoch:
    """Press Ctrl+C (raise KeyboardInterrupt) when epoch `epoch` (0-based) starts, on Keras, in a run that trained an
    earlier epoch (so that the same run resumed as it was goes on)."""

    def __new__(cls, epoch: int):
        import keras

        class _Interrupt(keras.callbacks.Callback):
            first: int | None = None

            def on_epoch_begin(self, current: int, logs=None) -> None:
                self.first = current if self.first is None else self.first
                if current == epoch and self.first < epoch:
                    raise KeyboardInterrupt

        return _Interrupt()


def keras_model_without_batchnorm(
    num_classes: int,
    image_size: int | None,
    record_xla: str | None = None,
    record_steps: str | None = None,
    record_sides: str | None = None,
    record_images: str | None = None,
    **unused,
):
    """A small conv net with no BatchNorm: its gradients do not depend on how a batch is split. With `record_xla`
    (a path), each trace of its forward pass appends to that file, as a JSON line, whether it was traced for
    training and whether TensorFlow traced it inside an XLA-compiled function. With `record_steps` (a path), each
    forward pass in training mode appends a line to that file (XLA cannot compile that); with `record_sides`, the
    side of the images it was given (height x width); with `record_images`, a sha1 of the images' bytes."""
    import keras

    inputs = keras.Input((image_size, image_size, 3))
    x = inputs if record_xla is None else _XlaTraceRecorder(record_xla)(inputs)
    x = x if record_steps is None else _StepRecorder(record_steps)(x)
    x = x if record_sides is None else _StepRecorder(record_sides, sides=True)(x)
    x = x if record_images is None else _StepRecorder(record_images, digests=True)(x)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def _StepRecorder(path: str, sides: bool = False, digests: bool = False):
    """A Keras layer passing its input through, which appends a line to `path` at each forward pass in training:
    "step", with `sides` the images' height x width, with `digests` a sha1 of the images' bytes."""
    import hashlib

    import keras
    import numpy as np
    import tensorflow as tf

    def append(height=None, width=None) -> np.int32:
        with open(path, "a") as fh:
            fh.write(f"{height}x{width}\n" if sides else "step\n")
        return np.int32(1)

    def append_digest(images) -> np.int32:
        with open(path, "a") as fh:
            fh.write(hashlib.sha1(np.ascontiguousarray(images).tobytes()).hexdigest() + "\n")
        return np.int32(1)

    class StepRecorder(keras.layers.Layer):
        def call(self, inputs, training=False):
            if training and digests:
                tf.numpy_function(append_digest, [inputs], Tout=tf.int32, stateful=True, name="record_images")
            elif training:
                shape = [tf.shape(inputs)[1], tf.shape(inputs)[2]] if sides else []
                tf.numpy_function(append, shape, Tout=tf.int32, stateful=True, name="record_step")
            return inputs

    return StepRecorder()


def _XlaTraceRecorder(path: str):
    """A Keras layer passing its input through, which records how TensorFlow traces it (see
    keras_model_without_batchnorm)."""
    import json

    import keras
    import tensorflow as tf
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext

    class XlaTraceRecorder(keras.layers.Layer):
        def call(self, inputs, training=False):
            graph = tf.compat.v1.get_default_graph()
            if tf.inside_function() and not graph.name.startswith("scratch_graph"):  # not Keras' shape inference
                record = {"training": bool(training), "xla": GraphOrParentsInXlaContext(graph), "graph": graph.name}
                with open(path, "a") as fh:
                    fh.write(json.dumps(record) + "\n")
            return inputs

    return XlaTraceRecorder()


class KerasRecordPolicies:
    """Write the dtype policies of the trained network's layers (that have weights) to `path`, as JSON."""

    def __new__(cls, path: str):
        import json

        import keras

        class _Record(keras.callbacks.Callback):
            def on_train_begin(self, logs=None) -> None:
                network = getattr(self.model, "network", self.model)
                policies = sorted({layer.dtype_policy.name for layer in network.layers if layer.weights})
                with open(path, "w") as fh:
                    json.dump(policies, fh)

        return _Record()


class RecordTorchSeed:
    """Write the seed torch's generator was seeded with, and the process's rank, into <folder>/seed_rank<R>.txt
    when training starts, on Lightning: what each DDP process really trains with."""

    def __new__(cls, folder: str):
        import os
        from pathlib import Path

        import lightning as L
        import torch

        class _Record(L.Callback):
            def on_train_start(self, trainer, pl_module) -> None:
                Path(folder).mkdir(parents=True, exist_ok=True)
                (Path(folder) / f"seed_rank{trainer.global_rank}.txt").write_text(
                    f"{torch.initial_seed()} {os.getpid()} {trainer.world_size}\n"
                )

        return _Record()


class RecordTrainingLabels:
    """Append the labels of every training batch this process trains on to <folder>/labels_rank<R>.txt, one
    line per batch, on Lightning: in a dataset whose every image is its own class, the files each rank read."""

    def __new__(cls, folder: str):
        from pathlib import Path

        import lightning as L

        class _Record(L.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
                Path(folder).mkdir(parents=True, exist_ok=True)
                labels = batch["labels"].reshape(-1).tolist()
                with open(Path(folder) / f"labels_rank{trainer.global_rank}.txt", "a") as fh:
                    fh.write(" ".join(str(int(label)) for label in labels) + "\n")

        return _Record()


class RecordDdp:
    """Write what wraps the network in this Lightning process when training starts to <folder>/ddp_rank<R>.json:
    the wrapper's class name and, for torch's DistributedDataParallel, its gradient bucket size in bytes."""

    def __new__(cls, folder: str):
        import json
        from pathlib import Path

        import lightning as L

        class _Record(L.Callback):
            def on_train_start(self, trainer, pl_module) -> None:
                wrapper = trainer.strategy.model
                seen = {"wrapper": type(wrapper).__name__, "bucket_bytes": getattr(wrapper, "bucket_bytes_cap", None)}
                Path(folder).mkdir(parents=True, exist_ok=True)
                (Path(folder) / f"ddp_rank{trainer.global_rank}.json").write_text(json.dumps(seen))

        return _Record()


def torch_model_without_batchnorm(
    num_classes: int,
    record_steps: str | None = None,
    record_sides: str | None = None,
    record_logits: str | None = None,
    **unused,
):
    """A small conv net with no BatchNorm, on torch: its gradients do not depend on how a batch is split. With
    `record_steps` (a path), each forward pass in training mode appends a line to that file; with `record_sides`,
    the side of the images it was given (height x width); with `record_logits` (a name), each forward pass in
    training mode keeps its logits as LAST_LOGITS[record_logits], for RecordLossTerms."""
    from torch import nn

    network = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, num_classes),
    )
    if record_steps is not None:

        def record(module, inputs, output) -> None:
            if module.training:
                with open(record_steps, "a") as fh:
                    fh.write("step\n")

        network.register_forward_hook(record)
    if record_sides is not None:

        def record_side(module, inputs, output) -> None:
            if module.training:
                with open(record_sides, "a") as fh:
                    fh.write(f"{inputs[0].shape[-2]}x{inputs[0].shape[-1]}\n")

        network.register_forward_hook(record_side)
    if record_logits is not None:

        def keep_logits(module, inputs, output) -> None:
            if module.training:
                LAST_LOGITS[record_logits] = output.detach().clone()

        network.register_forward_hook(keep_logits)
    return network


LAST_LOGITS: dict = {}  # name -> the logits of the last training forward pass of torch_model_without_batchnorm


class RecordLossTerms:
    """On Lightning, for each training step: the labels of the batch as the loader handed them over, the logits of
    torch_model_without_batchnorm(record_logits=`logits`) on it, and the loss Lightning backpropagates, saved to
    `path` (a .npz of labels, logits, losses, one row per step) when training ends: the loss can be recomputed by
    hand from what the network saw."""

    def __new__(cls, path: str, logits: str):
        import lightning as L
        import numpy as np

        class _Record(L.Callback):
            def __init__(self):
                self.labels, self.logits, self.losses, self._batch_labels = [], [], [], None

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                self._batch_labels = batch["labels"].detach().cpu().numpy().copy()

            def on_before_backward(self, trainer, pl_module, loss) -> None:
                self.labels.append(self._batch_labels)
                self.logits.append(LAST_LOGITS[logits].cpu().numpy())
                self.losses.append(float(loss.detach()))

            def on_train_end(self, trainer, pl_module) -> None:
                np.savez(path, labels=np.stack(self.labels), logits=np.stack(self.logits), losses=np.array(self.losses))

        return _Record()


class RecordDynamoGraphs:
    """Write, as JSON to `path`, how many graphs TorchDynamo compiled while Lightning trained and validated, and how
    many of them Inductor's and AOTAutograd's caches served or missed (torch._dynamo's own counters, read at the
    start and the end of fit)."""

    def __new__(cls, path: str):
        import json

        import lightning as L

        def counts() -> dict[str, int]:
            from torch._dynamo.utils import counters

            return {
                "graphs": int(counters["stats"]["unique_graphs"]),
                **{name: int(counters["inductor"][name]) for name in ("fxgraph_cache_hit", "fxgraph_cache_miss")},
                **{name: int(counters["aot_autograd"][name]) for name in ("autograd_cache_hit", "autograd_cache_miss")},
            }

        class _Record(L.Callback):
            def on_fit_start(self, trainer, pl_module) -> None:
                self.before = counts()

            def on_fit_end(self, trainer, pl_module) -> None:
                with open(path, "w") as fh:
                    json.dump({name: count - self.before[name] for name, count in counts().items()}, fh)

        return _Record()


class KerasRecordJit:
    """Write, as JSON to `path`, whether the Keras model that trains is XLA-compiled (its `jit_compile`, which Keras
    itself turns off where XLA cannot run) and whether its train function was built, after the first epoch."""

    def __new__(cls, path: str):
        import json

        import keras

        class _Record(keras.callbacks.Callback):
            def on_epoch_end(self, epoch: int, logs=None) -> None:
                with open(path, "w") as fh:
                    json.dump(
                        {
                            "jit_compile": bool(self.model.jit_compile),
                            "train_function": self.model.train_function is not None,
                        },
                        fh,
                    )

        return _Record()


class RecordPipelineThreads:
    """Write, as JSON to `path`, the num_threads of the DALI pipelines the Lightning training iterator holds, when
    training starts."""

    def __new__(cls, path: str):
        import json
        from pathlib import Path

        import lightning as L

        class _Record(L.Callback):
            def on_train_start(self, trainer, pl_module) -> None:
                iterator = trainer.datamodule.train_dataloader().iterator
                Path(path).write_text(json.dumps([pipe.num_threads for pipe in iterator._pipes]))

        return _Record()


class RecordWorkerCores:
    """Write, as JSON to `path`, the cores the OS lets each DALI worker thread of this process run on (read from
    /proc by thread name), and this process's own cores, after the first training step; `framework`: lightning or
    keras, the backend whose callback this is."""

    def __new__(cls, path: str, framework: str):
        import json
        import os
        from pathlib import Path

        from hydrali.core.data.affinity import worker_thread_cores

        def record() -> None:
            if not Path(path).exists():
                threads = {tid: sorted(cores) for tid, cores in worker_thread_cores().items()}
                process = sorted(os.sched_getaffinity(0))
                Path(path).write_text(json.dumps({"threads": threads, "process": process}))

        if framework == "keras":
            import keras

            class _KerasRecord(keras.callbacks.Callback):
                def on_train_batch_end(self, batch, logs=None) -> None:
                    record()

            return _KerasRecord()
        import lightning as L

        class _Record(L.Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                record()

        return _Record()


class RecordChangedWeights:
    """On Lightning: write to `path` (JSON) which entries of the network's state (weights and BatchNorm statistics)
    changed between the start and the end of training, and which did not."""

    def __new__(cls, path: str):
        import json

        import lightning as L

        class _Record(L.Callback):
            def on_train_start(self, trainer, pl_module) -> None:
                self.start = {k: v.detach().clone() for k, v in pl_module.torch_task.model.state_dict().items()}

            def on_train_end(self, trainer, pl_module) -> None:
                end = pl_module.torch_task.model.state_dict()
                changed = sorted(k for k, v in self.start.items() if not bool((end[k].cpu() == v.cpu()).all()))
                with open(path, "w") as fh:
                    json.dump({"changed": changed, "kept": sorted(set(self.start) - set(changed))}, fh)

        return _Record()


class KerasRecordChangedWeights:
    """On Keras: write to `path` (JSON) which of the network's variables (weights and BatchNorm statistics) changed
    between the start and the end of training, and which did not."""

    def __new__(cls, path: str):
        import json

        import keras
        import numpy as np

        class _Record(keras.callbacks.Callback):
            def on_train_begin(self, logs=None) -> None:
                self.start = {v.path: np.array(v.numpy()) for layer in self.model.layers for v in layer.variables}

            def on_train_end(self, logs=None) -> None:
                end = {v.path: np.array(v.numpy()) for layer in self.model.layers for v in layer.variables}
                changed = sorted(k for k, v in self.start.items() if not np.array_equal(end[k], v))
                with open(path, "w") as fh:
                    json.dump({"changed": changed, "kept": sorted(set(self.start) - set(changed))}, fh)

        return _Record()


SIGNAL_AT_STEP = "HYDRALI_TEST_SIGNAL_AT_STEP"  # the environment variable RecordBatches reads


class RecordBatches:
    """Record every training batch Lightning trains on, as DALI made it: one JSON line per step appended to `path`
    (`path`.rank<N> on the process of global rank N > 0: the epoch, the step in it, and a sha1 of each output's
    bytes). When the environment holds SIGNAL_AT_STEP=N, the process of global rank 0 sends itself SIGUSR1 after its
    N-th training step (counted from 1 in this process), as SLURM does before a preemption, once per `path` (a job
    that a launcher requeues keeps its environment): the environment, not the config, so that the run started again
    has the same settings."""

    def __new__(cls, path: str):
        import hashlib
        import json
        import os
        import signal

        import lightning as L

        signal_at = int(os.environ.get(SIGNAL_AT_STEP, "0"))

        class _Record(L.Callback):
            steps = 0

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                digests = {k: hashlib.sha1(v.detach().cpu().numpy().tobytes()).hexdigest() for k, v in batch.items()}
                rank = trainer.global_rank
                with open(path if rank == 0 else f"{path}.rank{rank}", "a") as fh:
                    fh.write(json.dumps({"epoch": trainer.current_epoch, "step": batch_idx, **digests}) + "\n")

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                self.steps += 1
                sent = f"{path}.signalled"
                if self.steps == signal_at and trainer.global_rank == 0 and not os.path.exists(sent):
                    open(sent, "w").close()
                    os.kill(os.getpid(), signal.SIGUSR1)

        return _Record()


class KerasSignalAtStep:
    """On Keras: when the environment holds SIGNAL_AT_STEP=N, the process sends itself SIGUSR1 after its N-th
    training step (counted from 1 in this process), as SLURM does before a preemption."""

    def __new__(cls):
        import os
        import signal

        import keras

        signal_at = int(os.environ.get(SIGNAL_AT_STEP, "0"))

        class _Signal(keras.callbacks.Callback):
            steps = 0

            def on_train_batch_end(self, batch: int, logs=None) -> None:
                self.steps += 1
                if self.steps == signal_at:
                    os.kill(os.getpid(), signal.SIGUSR1)

        return _Signal()


class RecordComputeThreads:
    """Write, as JSON to `path`, the compute (intra-op) threads the framework reports after the first training step:
    torch.get_num_threads() on Lightning, TensorFlow's intra-op parallelism on Keras (0: its default, one per core),
    and on Keras whether TensorFlow runs its oneDNN kernels ("onednn"); `framework`: lightning or keras, the backend
    whose callback this is."""

    def __new__(cls, path: str, framework: str):
        import json
        from pathlib import Path

        def record(threads: int, **more) -> None:
            if not Path(path).exists():
                Path(path).write_text(json.dumps({"threads": threads, **more}))

        if framework == "keras":
            import keras
            import tensorflow as tf
            from tensorflow.python.util import _pywrap_util_port  # TensorFlow's own answer, as its kernels read it

            class _KerasRecord(keras.callbacks.Callback):
                def on_train_batch_end(self, batch, logs=None) -> None:
                    threads = tf.config.threading.get_intra_op_parallelism_threads()
                    record(threads, onednn=bool(_pywrap_util_port.IsMklEnabled()))

            return _KerasRecord()
        import lightning as L
        import torch

        class _Record(L.Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                record(torch.get_num_threads())

        return _Record()


class KillOwnProcess:
    """A Lightning callback that SIGKILLs its own process (as the out-of-memory killer does) at the end of training
    epoch `epoch` of sweep job `job` (Hydra's job number), every time that job runs."""

    def __new__(cls, job: int, epoch: int = 1):
        import os
        import signal

        import lightning as L
        from hydra.core.hydra_config import HydraConfig

        class _Kill(L.Callback):
            def on_train_epoch_end(self, trainer, pl_module) -> None:
                if HydraConfig.get().job.num == int(job) and trainer.current_epoch + 1 == int(epoch):
                    os.kill(os.getpid(), signal.SIGKILL)

        return _Kill()


_held: list = []  # HoldMemory's blocks: alive as long as the process


class HoldMemory:
    """A Lightning callback that, as its job starts training, keeps `mb` MB more in its process for the process's
    life (as a worker keeps a job's decoded splits) and writes the process's id to `<run dir>/worker.pid`."""

    def __new__(cls, mb: int = 400):
        import os
        from pathlib import Path

        import lightning as L
        from hydra.core.hydra_config import HydraConfig

        class _Hold(L.Callback):
            def on_train_start(self, trainer, pl_module) -> None:
                _held.append(b"\x01" * (int(mb) << 20))  # written, so resident
                Path(HydraConfig.get().runtime.output_dir, "worker.pid").write_text(str(os.getpid()))

        return _Hold()


class RecordTrainingTimes:
    """Append, as a JSON line to `path`, the wall-clock time (time.time()) of each training event the framework
    (`framework`: lightning or keras) reports to its callbacks: "epoch_start", "step_start" and "step_end" (of each
    training step), "validation_start", "validation_end" and "epoch_end": when the run's training and its
    validations took place, seen from outside hydrali's own timing."""

    def __new__(cls, path: str, framework: str):
        import json
        import time

        def record(event: str) -> None:
            with open(path, "a") as fh:
                fh.write(json.dumps({"event": event, "time": time.time()}) + "\n")

        if framework == "keras":
            import keras

            class _KerasRecord(keras.callbacks.Callback):
                def on_epoch_begin(self, epoch: int, logs=None) -> None:
                    record("epoch_start")

                def on_train_batch_begin(self, batch: int, logs=None) -> None:
                    record("step_start")

                def on_train_batch_end(self, batch: int, logs=None) -> None:
                    record("step_end")

                def on_test_begin(self, logs=None) -> None:
                    record("validation_start")

                def on_test_end(self, logs=None) -> None:
                    record("validation_end")

                def on_epoch_end(self, epoch: int, logs=None) -> None:
                    record("epoch_end")

            return _KerasRecord()

        import lightning as L

        class _LightningRecord(L.Callback):
            def on_train_epoch_start(self, trainer, pl_module) -> None:
                record("epoch_start")

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                record("step_start")

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                record("step_end")

            def on_validation_start(self, trainer, pl_module) -> None:
                if not trainer.sanity_checking:
                    record("validation_start")

            def on_validation_end(self, trainer, pl_module) -> None:
                if not trainer.sanity_checking:
                    record("validation_end")

            def on_train_epoch_end(self, trainer, pl_module) -> None:
                record("epoch_end")

        return _LightningRecord()
