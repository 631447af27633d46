"""A compiled Keras model for a plan: network, optimizer with the plan's lr schedule, loss, metrics."""
from __future__ import annotations

import keras
import numpy as np
from omegaconf import DictConfig

from core.plan import Plan
from core.schedule import lr_factor

NO_WEIGHT_DECAY = ["bias", "gamma", "beta"]  # as on torch: no decay on biases and norm scales/shifts


@keras.saving.register_keras_serializable(package="hydrali")
class PlanSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The plan's effective lr times core.schedule.lr_factor, tabulated per step: the same lr at the
    same step as the Lightning backend, by construction."""

    def __init__(self, effective_lr: float, factors):
        self.effective_lr = float(effective_lr)
        self.factors = np.asarray(factors, dtype="float32")

    def __call__(self, step):
        last = self.factors.shape[0] - 1
        index = keras.ops.minimum(keras.ops.cast(step, "int32"), last)
        return self.effective_lr * keras.ops.take(keras.ops.convert_to_tensor(self.factors), index)

    def get_config(self) -> dict:
        return {"effective_lr": self.effective_lr, "factors": self.factors.tolist()}


def plan_schedule(plan: Plan, optim: DictConfig, steps_per_epoch: int) -> PlanSchedule:
    """The lr schedule of `plan`: warmup, then cosine or constant, over plan.epochs epochs."""
    total = max(1, steps_per_epoch * plan.epochs)
    factors = [lr_factor(step, steps_per_epoch=steps_per_epoch, epochs=plan.epochs,
                         warmup_epochs=optim.warmup_epochs, warmup_div=optim.warmup_div,
                         schedule=str(optim.schedule)) for step in range(total + 1)]
    return PlanSchedule(plan.effective_lr, factors)


def make_optimizer(optim: DictConfig, schedule) -> keras.optimizers.Optimizer:
    """SGD (momentum, Nesterov) or AdamW, with weight decay except on biases and norm parameters."""
    if str(optim.name) == "sgd":
        opt = keras.optimizers.SGD(learning_rate=schedule, momentum=optim.momentum, nesterov=optim.nesterov,
                                   weight_decay=optim.weight_decay or None)
    else:
        opt = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=optim.weight_decay,
                                     beta_1=optim.betas[0], beta_2=optim.betas[1])
    if optim.weight_decay:
        opt.exclude_from_weight_decay(var_names=NO_WEIGHT_DECAY)
    return opt


def compile_model(*, strategy, build_network, loss, metrics, optim: DictConfig, plan: Plan,
                  steps_per_epoch: int, jit_compile: bool = False) -> keras.Model:
    """Build the network, its optimizer, loss and metrics inside strategy.scope(), and compile."""
    with strategy.scope():
        model = build_network()
        optimizer = make_optimizer(optim, plan_schedule(plan, optim, steps_per_epoch))
        model.compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=jit_compile)
        optimizer.build(model.trainable_variables)  # so that a checkpoint can restore its state
    return model
