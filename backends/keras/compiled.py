"""A compiled Keras model for a plan: the task's network in a TaskModel (hydrali.backends.keras.model), with the
optimizer and schedule of hydrali.backends.keras.optimizers, built under backend.precision's dtype policy
(hydrali.backends.keras.precision) inside the run's distribution strategy, XLA-compiled with backend.compile.

`compile_task_model` (with hydrali.backends.keras.side.build_keras_side) is what the backend builds a run's model
with; the benchmark (bench/keras_loops.py) builds its upper bound with them too.
"""

from __future__ import annotations

import keras
from hydra.errors import InstantiationException

from hydrali.backends.keras.model import SampleCount, TaskModel
from hydrali.backends.keras.optimizers import make_optimizer, plan_schedule
from hydrali.backends.keras.precision import dtype_policy
from hydrali.backends.keras.side import start_network_from
from hydrali.core.contracts.run import OptimizerSettings, RunContract
from hydrali.core.errors import HydraliError
from hydrali.core.run.epoch import EpochSteps
from hydrali.core.run.plan import Plan
from hydrali.core.run.weights_from_run import RunWeights


def compile_model(
    *,
    strategy,
    build_network,
    loss,
    metrics,
    optim: OptimizerSettings,
    plan: Plan,
    contract: EpochSteps,
    precision: str = "32-true",
    jit_compile: bool = False,
    on_val_batch=None,
    backbone_of=None,
    evaluation_forward=None,
    image_size: int | None = None,
) -> TaskModel:
    """Build the network and its optimizer inside strategy.scope() and compile them under core's contracts; with
    optim.backbone_lr_mult, `backbone_of(network)` names the variables that take it; validation scores
    `evaluation_forward(network, x)` when given (e.g. flip averaging), else the network's output. `image_size`: the
    side to build with where the network takes any side."""
    with strategy.scope(), dtype_policy(precision):
        network = build_network()
        model = TaskModel(
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


def compile_task_model(*, contract: RunContract, side, strategy, dataset, start: RunWeights | None = None) -> TaskModel:
    """The model a Keras run trains: the side's network of the contract's model, compiled by compile_model with the
    plan's optimizer and schedule, the contract's precision and compile (XLA) setting; a HydraliError names what
    cannot be built. `start`: the earlier run (model.weights) its network starts from."""
    model = contract.task_inputs.model

    def network():
        # progressive_resizing: a network that takes any side (its first epochs train on smaller images)
        built_size = None if contract.train_sizes else contract.image_size
        try:
            built = side.build_model(model, dataset.num_classes, built_size)
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
