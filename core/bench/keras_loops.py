"""The benchmark's Keras side: the Keras step timer, and Keras' own upper bound for a task's network.

The upper bound is the model the Keras backend compiles (backends/keras/training.py compile_model: the same
network, optimizer, dtype policy and jit_compile), trained by its own `train_step` in a tf.function on one
batch of tensors already on the device: no input pipeline, no fit() loop.
These run in the benchmark's worker process (hydrali.core.bench.worker), which never loads torch.
"""
from __future__ import annotations

import keras
from omegaconf import DictConfig, OmegaConf

from hydrali.core.bench.timing import StepWindow, Timing, time_steps


def prepare(cfg: dict, device: str = "gpu"):
    """(config, task, dataset) in a fresh process: TensorFlow told to take GPU memory as needed (DALI shares
    the GPU) before anything starts its runtime."""
    from hydra.utils import instantiate

    from hydrali.backends.keras.strategy import configure_devices

    configure_devices(1, device)
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
    """Keras' own upper bound for the configured network, precision and jit_compile."""

    def __init__(self, conf: DictConfig, task, dataset, warmup: int, steps: int):
        import tensorflow as tf
        from hydra.utils import get_method

        from hydrali.backends.keras.training import compile_model
        from hydrali.core.bench.loaders import one_replica_plan

        plan = one_replica_plan(conf, dataset, "gpu")
        framework = get_method(task.keras_target)(task, dataset)
        self.warmup, self.steps, self.batch = warmup, steps, plan.per_replica_batch
        with tf.device("/gpu:0"):
            self.model = compile_model(
                strategy=tf.distribute.get_strategy(),
                build_network=lambda: framework.build_model(conf.model, dataset.num_classes, conf.data.image_size),
                loss=framework.loss(), metrics=framework.metrics(), optim=conf.optim, plan=plan, contract=plan.epoch,
                precision=str(conf.backend.precision), jit_compile=bool(conf.backend.compile))
            size = conf.data.image_size
            self.x = tf.random.normal((self.batch, size, size, 3))
            self.y = tf.random.uniform((self.batch, 1), maxval=dataset.num_classes, dtype=tf.int32)
        self.step = tf.function(lambda x, y: self.model.train_step((x, y)),
                                jit_compile=bool(conf.backend.compile))

    def once(self) -> Timing:
        """The Timing (images/s) of `steps` train steps after `warmup` (the last step's loss fetched before the clock stops)."""
        import tensorflow as tf

        with tf.device("/gpu:0"):
            return time_steps(lambda: self.step(self.x, self.y), warmup=self.warmup, steps=self.steps,
                              images_per_step=self.batch, sync=lambda logs: float(logs["loss"]))


def keras_bound(cfg: dict, warmup: int, steps: int) -> KerasBound:
    """The worker's factory of KerasBound (from a plain config)."""
    conf, task, dataset = prepare(cfg)
    return KerasBound(conf, task, dataset, warmup, steps)


def hydrali_training(cfg: dict, name: str, run_dir: str, warmup: int, steps: int):
    """The worker's factory of a Keras run through hydrali (hydrali.core.bench.training.HydraliTraining)."""
    from hydrali.backends.keras.strategy import configure_devices
    from hydrali.core.bench.training import HydraliTraining

    configure_devices(1, "gpu")
    return HydraliTraining(cfg, name, run_dir, warmup, steps)


def keras_layer(cfg: dict, device: str, warmup: int, batches: int):
    """The worker's factory of the Keras data layer's measurement (core/bench/loaders.py)."""
    from hydrali.core.bench.loaders import KerasLayer

    conf, task, dataset = prepare(cfg, device)
    return KerasLayer(task, conf, dataset, device, warmup, batches)
