"""The benchmark's Keras side: the Keras step timer, and Keras' own upper bound for a task's network.

The upper bound is the model the Keras backend trains, built by the backend's own builders
(backends/keras/strategy.py, training.py): the replica's device and strategy, the task's Keras side, and the model
compiled with the same network, optimizer, dtype policy and jit_compile. It is trained by its own `train_step` in a
tf.function on one batch already on the device (the shard's first batch of the backend's DALIDataset, fed again
at every step): no input pipeline, no fit() loop.
These run in the benchmark's worker process (hydrali.bench.worker), which never loads torch.
"""

from __future__ import annotations

from hydrali.backends.keras.quiet_start import import_tensorflow

import_tensorflow()  # first, so that no other import starts TensorFlow with its chatter

import keras  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from hydrali.bench.timing import StepWindow, Timing, time_steps  # noqa: E402


def prepare(cfg: dict):
    """(config, task, dataset) in a fresh process, from a plain config."""
    from hydra.utils import instantiate

    conf = OmegaConf.create(cfg)
    task = instantiate(conf.task)
    return conf, task, task.prepare_data(conf.data, verify="off")


class KerasStepTimer(keras.callbacks.Callback):
    """Times `steps` training steps after `warmup` ones (each end synchronized by reading a weight the step
    updated), then stops the fit; its Timing (images/s) lands in hydrali.bench.timing.STEP_WINDOWS[key]."""

    def __init__(self, key: str, warmup: int, steps: int, images_per_step: int):
        super().__init__()
        self.window = StepWindow(key, warmup, steps, images_per_step)

    def _sync(self) -> None:
        self.model.trainable_variables[-1].numpy()

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        if self.window.step_end(self._sync):
            self.model.stop_training = True


class KerasBound:
    """Keras' own train step for the configured network, precision and jit_compile, in a plain loop: `feed` =
    "tensors" (the shard's first batch, kept on the device and fed again at every step: Keras' upper bound) or
    "dali" (the backend's DALIDataset of the shard, `per_call` steps per tf.function call, as Keras' fit() runs
    `steps_per_execution` steps per call); DALI on `device`."""

    def __init__(
        self,
        conf: DictConfig,
        task,
        dataset,
        warmup: int,
        steps: int,
        device: str = "gpu",
        feed: str = "tensors",
        per_call: int = 1,
    ):
        import tensorflow as tf

        from hydrali.backends.keras.compiled import compile_task_model
        from hydrali.backends.keras.data import dali_dataset, distribute
        from hydrali.backends.keras.side import build_keras_side
        from hydrali.backends.keras.strategy import make_strategy, placement, replica_devices, training_device
        from hydrali.bench.loaders import one_replica_plan
        from hydrali.core.run.contract import contract_on_device

        plan = one_replica_plan(conf, dataset, device)
        self.devices = replica_devices(plan)
        contract = contract_on_device(conf, plan, training_device())  # `auto` as a run on this machine decides it
        strategy = make_strategy(self.devices)
        self.per_call = max(1, int(per_call))
        self.warmup, self.steps = -(-warmup // self.per_call), max(1, steps // self.per_call)  # in calls
        self.batch = plan.per_replica_batch * self.per_call  # images per call
        data = distribute(
            strategy,
            self.devices,
            plan.device,
            lambda replica: dali_dataset(
                task=task, contract=contract, dataset=dataset, replica=replica, is_training=True
            ),
        )
        with placement(self.devices):
            self.model = compile_task_model(
                contract=contract, side=build_keras_side(task, dataset), strategy=strategy, dataset=dataset
            )
            one_step = tf.function(lambda data: self.model.train_step(data), jit_compile=contract.compile)
            if feed == "tensors":
                self.data = tf.nest.map_structure(tf.identity, next(iter(data)))  # kept where the model computes
                self.step = lambda: one_step(self.data)
            else:  # as Keras' fit(): the iterator read outside XLA, each step's batch into the compiled step
                iterator = iter(data)

                @tf.function
                def steps_on_iterator(iterator):
                    logs = one_step(next(iterator))
                    for _ in range(self.per_call - 1):
                        logs = one_step(next(iterator))
                    return logs

                self.step = lambda: steps_on_iterator(iterator)

    def once(self) -> Timing:
        """The Timing (images/s) of the window's calls after the warm-up's (the last call's loss fetched before the
        clock stops)."""
        from hydrali.backends.keras.strategy import placement

        with placement(self.devices):
            return time_steps(
                self.step,
                warmup=self.warmup,
                steps=self.steps,
                images_per_step=self.batch,
                sync=lambda logs: float(logs["loss"]),
            )


def keras_bound(cfg: dict, warmup: int, steps: int, feed: str = "tensors", per_call: int = 1) -> KerasBound:
    """The worker's factory of KerasBound (from a plain config)."""
    conf, task, dataset = prepare(cfg)
    return KerasBound(conf, task, dataset, warmup, steps, feed=feed, per_call=per_call)


def hydrali_training(cfg: dict, name: str, run_dir: str, warmup: int, steps: int):
    """The worker's factory of a Keras run through hydrali (hydrali.bench.training.HydraliTraining)."""
    from hydrali.backends.keras.strategy import configure_devices
    from hydrali.bench.training import HydraliTraining

    configure_devices(1, "gpu")  # GPU memory taken as needed (DALI shares the GPU), before the runtime starts
    return HydraliTraining(cfg, name, run_dir, warmup, steps)


def keras_layer(cfg: dict, device: str, warmup: int, batches: int):
    """The worker's factory of the Keras data layer's measurement (bench/loaders.py)."""
    from hydrali.bench.loaders import KerasLayer

    conf, task, dataset = prepare(cfg)
    return KerasLayer(task, conf, dataset, device, warmup, batches)
