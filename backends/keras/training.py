"""A compiled Keras model for a plan: the task's network in a model that follows core's contracts.

- the optimizer implements hydrali.core.optim.optimizer's semantics (torch's SGD with coupled weight decay, or
  torch's AdamW with decoupled decay; no decay on biases and norm parameters),
- the lr at every step is the plan's effective lr times hydrali.core.optim.schedule.lr_factor,
- optim.ema_decay is Keras' own optimizer EMA (use_ema), taken after optimizer steps only (hydrali.core.optim.ema),
- validation weighs each sample by hydrali.core.run.epoch's mask: the shard's padding counts for nothing,
- `images` (a weighted metric) counts the samples trained on or scored,
- backend.precision selects a Keras dtype policy (16-mixed scales the loss),
- backend.compile XLA-compiles the train step (jit_compile; on several replicas each replica's forward and
  backward pass, the all-reduce and the update around it) and validation's forward pass (the task's look at
  the batch, such as detection's non-max suppression, stays outside XLA).

`build_keras_side` and `compile_task_model` are what the backend builds a run's model with; the benchmark
(bench/keras_loops.py) builds its upper bound with them too.
"""

from __future__ import annotations

import contextlib
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from hydra.errors import InstantiationException
from keras import ops
from keras.src.losses.loss import unscale_loss_for_distribution

from hydrali.backends.keras.resizing import scaled
from hydrali.backends.keras.spec import SPEC
from hydrali.core.config.schema import Optimizer, Precision, WeightDecayOn
from hydrali.core.contracts.run import OptimizerSettings, RunContract
from hydrali.core.contracts.task import KERAS_SIDE, checked_side, side_builder
from hydrali.core.errors import HydraliError, first_line
from hydrali.core.optim.optimizer import ADAM_EPSILON, decays
from hydrali.core.optim.schedule import optimizer_step_factor
from hydrali.core.run.epoch import EpochContract
from hydrali.core.run.plan import Plan
from hydrali.core.run.weights_from_run import RunWeights

POLICIES = {
    Precision["32-true"]: "float32",
    Precision["bf16-mixed"]: "mixed_bfloat16",
    Precision["16-mixed"]: "mixed_float16",
}  # backend.precision -> the Keras dtype policy


@keras.saving.register_keras_serializable(package="hydrali")
class PlanSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The plan's effective lr times hydrali.core.optim.schedule.lr_factor, tabulated per optimizer step: the same
    lr at the same step as the Lightning backend, by construction. Keras asks it with the number of batches trained
    (its optimizer's `_iterations`, which gradient accumulation does not divide): `accumulate` batches make a step.
    The effective lr is read from a variable, not written into the graph: jobs of a sweep over the lr compile the same
    step, which XLA's kept compiled steps (backend.xla_cache) then serve to all of them."""

    def __init__(self, effective_lr: float, factors, accumulate: int = 1):
        self.effective_lr = float(effective_lr)
        self.factors = np.asarray(factors, dtype="float32")
        self.accumulate = int(accumulate)
        self._lr = keras.Variable(self.effective_lr, dtype="float32", trainable=False, name="effective_lr")

    def __call__(self, step):
        last = self.factors.shape[0] - 1
        index = ops.minimum(ops.floor_divide(ops.cast(step, "int32"), self.accumulate), last)
        return self._lr * ops.take(ops.convert_to_tensor(self.factors), index)

    def get_config(self) -> dict:
        return {"effective_lr": self.effective_lr, "factors": self.factors.tolist(), "accumulate": self.accumulate}


def plan_schedule(plan: Plan, optim: OptimizerSettings, contract: EpochContract) -> PlanSchedule:
    """The lr schedule of `plan`: warmup, then cosine or constant, over plan.epochs epochs of the contract's
    optimizer steps."""
    steps_per_epoch = contract.optimizer_steps
    total = max(1, steps_per_epoch * plan.epochs)
    factors = [
        optimizer_step_factor(step, optim, steps_per_epoch=steps_per_epoch, epochs=plan.epochs)
        for step in range(total + 1)
    ]
    return PlanSchedule(plan.effective_lr, factors, contract.accumulate)


class LrFactors:
    """Per-variable lr factors for hydrali's Keras optimizers (optim.backbone_lr_mult): `scale_lr` before the
    optimizer is built; then every update of a scaled variable takes lr x its factor."""

    def scale_lr(self, variables, factor: float) -> None:
        """Update `variables` with lr x `factor` (call before the optimizer is built)."""
        self._scaled = {**getattr(self, "_scaled", {}), **{self._var_key(v): float(factor) for v in variables}}

    def build_lr_factors(self, variables) -> None:
        """The factor of each variable the optimizer updates, by its index (1 for those not scaled)."""
        scaled = getattr(self, "_scaled", {})
        self._lr_factors = [scaled.get(self._var_key(v), 1.0) for v in variables]

    def scaled_lr(self, learning_rate, variable):
        """`learning_rate` times the variable's factor."""
        factor = self._lr_factors[self._get_variable_index(variable)]
        return learning_rate if factor == 1.0 else ops.multiply(learning_rate, ops.cast(factor, learning_rate.dtype))


class StepAverage:
    """Keras' optimizer EMA (use_ema, ema_momentum) as hydrali.core.optim.ema defines it. Keras averages after every
    batch, also one that only accumulated gradients (gradient_accumulation_steps): here, after optimizer steps only.
    (Its first update takes the weights as they are, since Keras' `iterations` counts optimizer steps: ema_1 = w_1.)"""

    def _update_model_variables_moving_average(self, trainable_variables):
        average = super()._update_model_variables_moving_average
        if not self.gradient_accumulation_steps:
            return average(trainable_variables)
        stepped = ops.equal(ops.mod(self._iterations + 1, self.gradient_accumulation_steps), 0)  # before the count
        ops.cond(stepped, lambda: average(trainable_variables), lambda: None)


@keras.saving.register_keras_serializable(package="hydrali")
class TorchSGD(LrFactors, StepAverage, keras.optimizers.Optimizer):
    """SGD with torch.optim.SGD's update rule (hydrali.core.optim.optimizer): coupled weight decay on decaying
    parameters, buf = momentum * buf + g, step = g + momentum * buf (Nesterov) or buf, w -= lr * step."""

    def __init__(
        self,
        learning_rate=0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
        coupled_weight_decay: float = 0.0,
        weight_decay_on: str = WeightDecayOn.kernels.value,
        name: str = "torch_sgd",
        **kwargs,
    ):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self.coupled_weight_decay, self.weight_decay_on = float(coupled_weight_decay), str(weight_decay_on)

    def build(self, variables):
        """Create one momentum buffer per variable (none without momentum)."""
        if self.built:
            return
        super().build(variables)
        self.buffers = self.add_optimizer_variables(variables, "momentum_buffer") if self.momentum else []
        self.build_lr_factors(variables)

    def update_step(self, gradient, variable, learning_rate):
        """One torch-style SGD step of `variable`."""
        lr = self.scaled_lr(ops.cast(learning_rate, variable.dtype), variable)
        g = ops.cast(gradient, variable.dtype)
        if self.coupled_weight_decay and decays(variable.shape, self.weight_decay_on):
            g = ops.add(g, ops.multiply(ops.cast(self.coupled_weight_decay, variable.dtype), variable))
        if self.momentum:
            momentum = ops.cast(self.momentum, variable.dtype)
            buf = self.buffers[self._get_variable_index(variable)]
            self.assign(buf, ops.add(ops.multiply(buf, momentum), g))
            g = ops.add(g, ops.multiply(buf, momentum)) if self.nesterov else buf
        self.assign_sub(variable, ops.multiply(g, lr))

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "coupled_weight_decay": self.coupled_weight_decay,
            "weight_decay_on": self.weight_decay_on,
        }


@keras.saving.register_keras_serializable(package="hydrali")
class TorchAdamW(LrFactors, StepAverage, keras.optimizers.Optimizer):
    """AdamW with torch.optim.AdamW's update rule (hydrali.core.optim.optimizer): w *= 1 - lr * weight_decay on decaying
    parameters, then m, v moments and w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + epsilon).
    (Keras' AdamW adds epsilon before the bias correction, which moves small-gradient steps.)"""

    def __init__(
        self,
        learning_rate=0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = ADAM_EPSILON,
        decoupled_weight_decay: float = 0.0,
        weight_decay_on: str = WeightDecayOn.kernels.value,
        name: str = "torch_adamw",
        **kwargs,
    ):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self.decoupled_weight_decay, self.weight_decay_on = float(decoupled_weight_decay), str(weight_decay_on)

    def build(self, variables):
        """Create the first and second moment of each variable."""
        if self.built:
            return
        super().build(variables)
        self.moments = self.add_optimizer_variables(variables, "moment")
        self.squares = self.add_optimizer_variables(variables, "square")
        self.build_lr_factors(variables)

    def update_step(self, gradient, variable, learning_rate):
        """One torch-style AdamW step of `variable`."""
        dtype = variable.dtype
        lr, g = self.scaled_lr(ops.cast(learning_rate, dtype), variable), ops.cast(gradient, dtype)
        t = ops.cast(self.iterations + 1, dtype)
        b1, b2 = ops.cast(self.beta_1, dtype), ops.cast(self.beta_2, dtype)
        if self.decoupled_weight_decay and decays(variable.shape, self.weight_decay_on):
            self.assign(variable, ops.multiply(variable, 1.0 - lr * ops.cast(self.decoupled_weight_decay, dtype)))
        index = self._get_variable_index(variable)
        m, v = self.moments[index], self.squares[index]
        self.assign(m, ops.add(ops.multiply(m, b1), ops.multiply(g, 1.0 - b1)))
        self.assign(v, ops.add(ops.multiply(v, b2), ops.multiply(ops.square(g), 1.0 - b2)))
        denominator = ops.sqrt(v) / ops.sqrt(1.0 - ops.power(b2, t)) + ops.cast(self.epsilon, dtype)
        self.assign_sub(variable, ops.divide(ops.multiply(m, lr / (1.0 - ops.power(b1, t))), denominator))

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
            "decoupled_weight_decay": self.decoupled_weight_decay,
            "weight_decay_on": self.weight_decay_on,
        }


def weight_average(optim: OptimizerSettings) -> dict:
    """The optimizer's arguments of optim.ema_decay: Keras' EMA with that momentum, or none (the setting absent or
    null)."""
    decay = optim.ema_decay
    return {} if decay is None else {"use_ema": True, "ema_momentum": float(decay)}


OPTIMIZERS = {  # optim.name -> the Keras optimizer with torch's semantics, with the optim node's settings
    Optimizer.sgd: lambda optim, schedule, accumulation: TorchSGD(
        learning_rate=schedule,
        momentum=optim.momentum,
        nesterov=optim.nesterov,
        coupled_weight_decay=optim.weight_decay,
        weight_decay_on=optim.weight_decay_on,
        gradient_accumulation_steps=accumulation,
        **weight_average(optim),
    ),
    Optimizer.adamw: lambda optim, schedule, accumulation: TorchAdamW(
        learning_rate=schedule,
        beta_1=optim.betas[0],
        beta_2=optim.betas[1],
        epsilon=ADAM_EPSILON,
        decoupled_weight_decay=optim.weight_decay,
        weight_decay_on=optim.weight_decay_on,
        gradient_accumulation_steps=accumulation,
        **weight_average(optim),
    ),
}


def make_optimizer(optim: OptimizerSettings, schedule, accumulate: int = 1) -> keras.optimizers.Optimizer:
    """The optimizer of hydrali.core.optim.optimizer's semantics (which variables decay is decided by their shape),
    stepping with the mean gradient of every `accumulate` batches (Keras' gradient accumulation), averaging the
    weights with optim.ema_decay (hydrali.core.optim.ema)."""
    accumulation = int(accumulate) if accumulate > 1 else None  # Keras takes None for a step after every batch
    return OPTIMIZERS[Optimizer.of(optim.name, "optim.name")](optim, schedule, accumulation)


@keras.saving.register_keras_serializable(package="hydrali")
class SampleCount(keras.metrics.Metric):
    """The number of samples seen (their sample weights summed when given): `images` in the logs."""

    def __init__(self, name: str = "images", **kwargs):
        super().__init__(name=name, **kwargs)
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Add the batch's samples (or its weights' sum)."""
        if sample_weight is None:
            sample_weight = ops.ones((ops.shape(y_pred)[0],), dtype="float32")
        self.count.assign_add(ops.sum(ops.cast(sample_weight, "float32")))

    def result(self):
        """The count so far (a value, not the variable: logs must not change when it is reset)."""
        return ops.convert_to_tensor(self.count) * 1.0

    def reset_state(self):
        self.count.assign(0.0)


class ContractModel(keras.Model):
    """The task's network, trained by Keras' own train step and validated under core's epoch contract:
    sample i of validation batch `val_step` on replica r counts iff val_step * batch + i < the shard's size.
    (A replica's id in sync, counted over every worker of the job, is its shard id.)"""

    def __init__(
        self, network: keras.Model, val_shard_sizes, batch: int, on_val_batch=None, evaluation_forward=None, **kwargs
    ):
        super().__init__(**kwargs)
        self.network = network
        self.on_val_batch = on_val_batch  # the task's look at each validation batch: (data, y_pred, weights)
        self.evaluation_forward = evaluation_forward  # the task's validation output (network, x), else the network's
        self.val_shard_sizes = [int(s) for s in val_shard_sizes]  # one per shard of the job
        self.batch = int(batch)
        self.val_step = keras.Variable(0, dtype="int32", trainable=False, name="val_step")
        self.validation_forward = None  # the XLA-compiled forward pass of validation (make_test_function)
        self.train_side = None  # the side training batches are scaled to (progressive_resizing); None: as they come
        self.replica_gradients = None  # the XLA-compiled gradients of one replica, on several (make_train_function)

    def call(self, inputs, training=False):
        return self.network(inputs, training=training)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Keras builds the model's metrics from a first batch, which it reduces across replicas as one nested
        value; MultiWorkerMirroredStrategy reduces only single tensors: take this worker's batch instead."""
        if iterator is not None and isinstance(self.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(
                    lambda value: self.distribute_strategy.experimental_local_results(value)[0], next(it)
                )
                break
            iterator = None
        super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def make_train_function(self, force=False):
        """Keras' training function. With XLA (backend.compile) on one replica, Keras compiles the whole step. On
        several replicas (MirroredStrategy, TF_CONFIG workers) only each replica's forward and backward pass is
        XLA-compiled (`replica_gradients`): the gradients' all-reduce and the optimizer's update, which cross the
        replicas, run as a TensorFlow graph around it. (Keras compiles `strategy.run` over every replica as one XLA
        function, which cannot reach the other devices' variables: keras-team/keras #19005, #18145.)"""
        if not self.jit_compile or self.distribute_strategy.num_replicas_in_sync == 1:
            self.replica_gradients = None
            return super().make_train_function(force)
        self.replica_gradients = tf.function(self._gradients, jit_compile=True, reduce_retracing=True)
        with self._keras_xla_off():
            return super().make_train_function(force)

    def _gradients(self, x, y, sample_weight):
        """One replica's loss (as the loss tracker takes it), predictions and gradients on its batch."""
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            scaled = self.optimizer.scale_loss(loss)  # 16-mixed: the loss scale (else the loss itself)
        return unscale_loss_for_distribution(loss), y_pred, tape.gradient(scaled, self.trainable_weights)

    def train_step(self, data):
        if self.train_side is not None:  # progressive_resizing: a static side, set before the function is traced
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            data = keras.utils.pack_x_y_sample_weight(scaled(x, self.train_side), y, sample_weight)
        if self.replica_gradients is None:
            return self._reducible(super().train_step(data))
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred, gradients = self.replica_gradients(x, y, sample_weight)
        self._loss_tracker.update_state(loss, sample_weight=tf.shape(tf.nest.flatten(x)[0])[0])
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))  # all-reduce, then update
        return self._reducible(self.compute_metrics(x, y, y_pred, sample_weight=sample_weight))

    def make_test_function(self, force=False):
        """Keras' validation function. With XLA (backend.compile) only the network's forward pass is XLA-compiled:
        the rest of the step, the task's look at the batch included (detection's non-max suppression, which XLA
        cannot compile), runs as a TensorFlow graph around it."""
        if not self.jit_compile:
            self.validation_forward = None
            return super().make_test_function(force)
        self.validation_forward = tf.function(self._forward, jit_compile=True, reduce_retracing=True)
        with self._keras_xla_off():
            return super().make_test_function(force)

    @contextlib.contextmanager
    def _keras_xla_off(self):
        """Keras builds its step function without XLA meanwhile (hydrali compiles the parts XLA can take itself);
        jit_compile stays on for the model after."""
        self.jit_compile = False
        try:
            yield
        finally:
            self.jit_compile = True

    def _forward(self, x):
        if self.evaluation_forward is not None:
            return self.evaluation_forward(self.network, x)
        return self(x, training=False)

    def _reducible(self, logs: dict) -> dict:
        """A step's logs as Keras can average them over TF_CONFIG workers: under MultiWorkerMirroredStrategy it
        reduces along axis 0, which a scalar lacks (elsewhere it averages the replicas' scalars as they are)."""
        if not isinstance(self.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return logs
        return {name: ops.reshape(value, (1,)) if len(value.shape) == 0 else value for name, value in logs.items()}

    def valid_mask(self):
        """1.0 for the real samples of this replica's current validation batch, 0.0 for padding."""
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        size = tf.gather(tf.constant(self.val_shard_sizes, dtype="int32"), replica)
        position = self.val_step * self.batch + tf.range(self.batch, dtype="int32")
        return tf.cast(position < size, "float32")

    def test_step(self, data):
        x, y = data[0], data[1]  # further elements (e.g. image ids) are for the task's on_val_batch
        weights = self.valid_mask()
        y_pred = self._forward(x) if self.validation_forward is None else self.validation_forward(x)
        if self.on_val_batch is not None:
            self.on_val_batch(data, y_pred, weights)
        per_sample = self.loss.call(y, ops.cast(y_pred, "float32"))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(per_sample, sample_weight=weights)  # the mean over real samples only
        return self._reducible(self.compute_metrics(x, y, y_pred, sample_weight=weights))


class ValidationPosition(keras.callbacks.Callback):
    """Tells the model which validation batch comes next (the mask of hydrali.core.run.epoch depends on it)."""

    def on_test_batch_begin(self, batch: int, logs=None) -> None:
        self.model.val_step.assign(batch)


@contextlib.contextmanager
def dtype_policy(precision: str):
    """Build layers under the Keras dtype policy of backend.precision, restoring the previous policy after."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(POLICIES[Precision.of(precision, "backend.precision")])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def compile_model(
    *,
    strategy,
    build_network,
    loss,
    metrics,
    optim: OptimizerSettings,
    plan: Plan,
    contract: EpochContract,
    precision: str = "32-true",
    jit_compile: bool = False,
    on_val_batch=None,
    backbone_of=None,
    evaluation_forward=None,
    image_size: int | None = None,
) -> ContractModel:
    """Build the network and its optimizer inside strategy.scope() and compile them under core's contracts; with
    optim.backbone_lr_mult, `backbone_of(network)` names the variables that take it; validation scores
    `evaluation_forward(network, x)` when given (e.g. flip averaging), else the network's output. `image_size`: the
    side to build with where the network takes any side."""
    with strategy.scope(), dtype_policy(precision):
        network = build_network()
        model = ContractModel(
            network,
            [contract.val_shard_size(shard) for shard in range(plan.num_shards)],
            plan.per_replica_batch,
            on_val_batch,
            evaluation_forward,
        )
        model(keras.ops.zeros((1, *(image_size if d is None else d for d in network.input_shape[1:]))))  # its variables
        optimizer = make_optimizer(optim, plan_schedule(plan, optim, contract), contract.accumulate)
        mult = optim.backbone_lr_mult
        if mult != 1.0:  # backbone_of: the side's backbone variables of its network
            optimizer.scale_lr(backbone_of(network), mult)
        model.compile(
            optimizer=optimizer, loss=loss, weighted_metrics=[*metrics, SampleCount()], jit_compile=jit_compile
        )
        model.optimizer.build(model.trainable_variables)  # so that a checkpoint can restore its state
    return model


def build_keras_side(task, dataset):
    """The task's Keras side (network builder, loss, metrics, callbacks) for `dataset`; a HydraliError names the
    side that cannot be imported or built, or the hooks of hydrali.core.contracts.task.KerasSide it lacks."""
    build = side_builder(task, SPEC.framework, SPEC.name)
    try:
        side = build(task, dataset)
    except Exception as err:
        raise HydraliError(f"task.sides.{SPEC.framework}={task.sides[SPEC.framework]} cannot be built: {err}") from err
    return checked_side(side, KERAS_SIDE, task, SPEC.framework)


def start_network_from(network: keras.Model, side, start: RunWeights, weights: str, image_size: int) -> None:
    """Start `network` (built by the task's Keras `side`) from the checkpoint of an earlier run (model.weights,
    found by hydrali.core.run.weights_from_run): that run's network is built as it was and loaded from its
    checkpoint, then the side copies its weights, with a new head when the classes differ."""
    try:
        trained = load_network(side, start.model(), start.num_classes, image_size, start.checkpoint)
        head = side.initialise_from(network, trained)
    except HydraliError as err:
        raise HydraliError(f"model.weights={weights}: {start.checkpoint}: {err}") from err
    except Exception as err:
        raise HydraliError(f"model.weights={weights}: {start.checkpoint} cannot be read ({first_line(err)})") from err
    start.announce(head)


def load_network(side, model: Any, num_classes: int, image_size: int, checkpoint) -> keras.Model:
    """The network that the task's Keras `side` builds from the `model` node (untrained: as_built), with the weights
    of a hydrali Keras checkpoint (which holds it wrapped in a ContractModel, and the optimizer's state: skipped)."""
    network = side.build_model(model, num_classes, image_size)
    holder = ContractModel(network, [1], batch=1)
    holder(keras.ops.zeros((1, *network.input_shape[1:])))
    with _quiet_keras_loading():
        holder.load_weights(checkpoint)
    return network


@contextlib.contextmanager
def _quiet_keras_loading():
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*[Ss]kipping variable loading.*")
        yield


def compile_task_model(
    *, contract: RunContract, side, strategy, dataset, start: RunWeights | None = None
) -> ContractModel:
    """The model a Keras run trains: the side's network of the contract's model, compiled by compile_model with the
    plan's optimizer and schedule, the contract's precision and compile (XLA) setting; a HydraliError names what
    cannot be built. `start`: the earlier run (model.weights) its network starts from."""
    model = contract.task_inputs.model

    def network():
        # progressive_resizing: a network that takes any side (its first epochs train on smaller images)
        built_side = None if contract.train_sides else contract.image_size
        try:
            built = side.build_model(model, dataset.num_classes, built_side)
        except (InstantiationException, TypeError, ValueError) as err:
            raise HydraliError(f"model={contract.network} cannot be built on Keras: {err}") from err
        if start is not None:
            start_network_from(built, side, start, str(contract.start_weights), contract.image_size)
        return built

    try:
        return compile_model(
            strategy=strategy,
            build_network=network,
            loss=side.loss(),
            metrics=side.metrics(),
            optim=contract.optim,
            plan=contract.plan,
            contract=contract.plan.epoch,
            precision=contract.precision,
            jit_compile=contract.compile,
            on_val_batch=side.on_val_batch,
            backbone_of=side.backbone_variables,
            evaluation_forward=side.evaluation_forward,
            image_size=contract.image_size,
        )
    except (InstantiationException, TypeError, ValueError) as err:
        raise HydraliError(
            f"the Keras optimizer or loss cannot be set up (optim={contract.optim.name}, "
            f"backend.precision={contract.precision}): {err}"
        ) from err
