"""hydrali's Keras optimizers and lr schedule: core's optimizer semantics on Keras.

- the optimizer implements hydrali.core.optim.optimizer's semantics (torch's SGD with coupled weight decay, or
  torch's AdamW with decoupled decay; no decay on biases and norm parameters), with optim.backbone_lr_mult's
  per-variable lr factors,
- the lr at every step is the plan's effective lr times hydrali.core.optim.schedule.lr_factor,
- optim.ema_decay is Keras' own optimizer EMA (use_ema), taken after optimizer steps only (hydrali.core.optim.ema).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from hydrali.core.config.schema import Optimizer, WeightDecayOn
from hydrali.core.contracts.run import OptimizerSettings
from hydrali.core.optim.optimizer import ADAM_EPSILON, decays
from hydrali.core.optim.schedule import optimizer_step_factor
from hydrali.core.run.epoch import EpochSteps
from hydrali.core.run.plan import Plan


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


def plan_schedule(plan: Plan, optim: OptimizerSettings, contract: EpochSteps) -> PlanSchedule:
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
