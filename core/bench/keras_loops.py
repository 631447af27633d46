"""The benchmark's Keras side: the Keras step timer, and Keras' own upper bound for a task's network.

The upper bound is the model the Keras backend trains, built by the backend's own builders
(backends/keras/strategy.py, training.py): the replica's device and strategy, the task's Keras side, and the model
compiled with the same network, optimizer, dtype policy and jit_compile. It is trained by its own `train_step` in a
tf.function on one batch already on the device (the shard's first batch of the backend's DALIDataset, fed again
at every step): no input pipeline, no fit() loop.
These run in the benchmark's worker process (hydrali.core.bench.worker), which never loads torch.
"""

from __future__ import annotations

from hydrali.backends.keras.quiet_start import import_tensorflow

import_tensorflow()  # first, so that no other import starts TensorFlow with its chatter

import keras  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from hydrali.core.bench.timing import StepWindow, Timing, time_steps  # noqa: E402


def prepare(cfg: dict):
    """(config, task, dataset) in a fresh process, from a plain config."""
    from hydra.utils import instantiate

    conf = OmegaConf.create(cfg)
    task = instantiate(conf.task)
    return conf, task, task.prepare_data(conf.data, verify="off")


class KerasStepTimer(keras.callbacks.Callback):
    """Times `steps` training steps after `warmup` ones (each end synchronized by reading a weight the step
    updated), then stops the fit; its Timing (images/s) lands in hydrali.core.bench.timing.STEP_WINDOWS[key]."""

    def __init__(self, key: str, warmup: int, steps: int, images_per_step: int):
        super().__init__()
        self.window = StepWindow(key, warmup, steps, images_per_step)

    def _sync(self) -> None:
        self.model.trainable_variables[-1].numpy()

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        if self.window.step_end(self._sync):
            self.model.stop_training = True


class KerasBound:
    """Keras' own upper bound for the configured network, precision and jit_compile; DALI on `device` gives it
    its one batch."""

    def __init__(self, conf: DictConfig, task, dataset, warmup: int, steps: int, device: str = "gpu"):
        import tensorflow as tf

        from hydrali.backends.keras.data import dali_dataset, distribute
        from hydrali.backends.keras.strategy import make_strategy, placement, replica_devices
        from hydrali.backends.keras.training import build_keras_side, compile_task_model
        from hydrali.core.bench.loaders import one_replica_plan

        plan = one_replica_plan(conf, dataset, device)
        self.devices = replica_devices(plan)
        strategy = make_strategy(self.devices)
        self.warmup, self.steps, self.batch = warmup, steps, plan.per_replica_batch
        data = distribute(
            strategy,
            self.devices,
            plan.device,
            lambda replica: dali_dataset(
                task=task, cfg=conf, dataset=dataset, plan=plan, replica=replica, is_training=True
            ),
        )
        with placement(self.devices):
            self.model = compile_task_model(
                cfg=conf, side=build_keras_side(task, dataset), strategy=strategy, dataset=dataset, plan=plan
            )
            self.data = tf.nest.map_structure(tf.identity, next(iter(data)))  # kept where the model computes
        self.step = tf.function(lambda data: self.model.train_step(data), jit_compile=bool(conf.backend.compile))

    def once(self) -> Timing:
        """The Timing (images/s) of `steps` train steps after `warmup` (the last step's loss fetched before the clock
        stops)."""
        from hydrali.backends.keras.strategy import placement

        with placement(self.devices):
            return time_steps(
                lambda: self.step(self.data),
                warmup=self.warmup,
                steps=self.steps,
                images_per_step=self.batch,
                sync=lambda logs: float(logs["loss"]),
            )


def keras_bound(cfg: dict, warmup: int, steps: int) -> KerasBound:
    """The worker's factory of KerasBound (from a plain config)."""
    conf, task, dataset = prepare(cfg)
    return KerasBound(conf, task, dataset, warmup, steps)


def hydrali_training(cfg: dict, name: str, run_dir: str, warmup: int, steps: int):
    """The worker's factory of a Keras run through hydrali (hydrali.core.bench.training.HydraliTraining)."""
    from hydrali.backends.keras.strategy import configure_devices
    from hydrali.core.bench.training import HydraliTraining

    configure_devices(1, "gpu")  # GPU memory taken as needed (DALI shares the GPU), before the runtime starts
    return HydraliTraining(cfg, name, run_dir, warmup, steps)


def keras_layer(cfg: dict, device: str, warmup: int, batches: int):
    """The worker's factory of the Keras data layer's measurement (core/bench/loaders.py)."""
    from hydrali.core.bench.loaders import KerasLayer

    conf, task, dataset = prepare(cfg)
    return KerasLayer(task, conf, dataset, device, warmup, batches)
