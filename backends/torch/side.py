"""The task's torch side as a torch backend trains it: built from the task and the model config, started from an
earlier run's checkpoint (model.weights), and its network compiled (backend.compile)."""

from __future__ import annotations

from typing import Any

import torch
from hydra.errors import InstantiationException

from hydrali.backends.torch import compile_cache
from hydrali.core.contracts.task import TORCH_SIDE, checked_side, side_builder
from hydrali.core.errors import HydraliError, first_line
from hydrali.core.run.weights_from_run import RunWeights

FRAMEWORK = "torch"  # the framework of the task's side built here (task.sides.torch)


def build_torch_side(task, dataset, *, model: Any, image_size: int, backend: str) -> torch.nn.Module:
    """The task's torch side (network, loss, metrics) for `dataset`, with the network of the `model` node (handed to
    the task's builder) at `image_size`; a HydraliError names the side or the model that cannot be built (and
    `backend`, the backend that asked for the side), or the hooks of hydrali.core.contracts.task.TorchSide the side
    lacks."""
    build = side_builder(task, FRAMEWORK, backend)
    try:
        side = build(task, model, dataset, image_size)
    except (InstantiationException, TypeError, ValueError) as err:
        raise HydraliError(f"model={model.get('_target_')} cannot be built: {err}") from err
    if not isinstance(side, torch.nn.Module):
        raise HydraliError(
            f"task.sides.{FRAMEWORK}={task.sides[FRAMEWORK]} built a {type(side).__name__}, not a torch.nn.Module"
        )
    return checked_side(side, TORCH_SIDE, task, FRAMEWORK)


SIDE = "torch_task"  # the attribute holding the task's torch side in the trained module (the Lightning backend's
#   HydraliModule): the side's keys in a checkpoint's state_dict start so


def start_side_from(side: torch.nn.Module, start: RunWeights, weights: str) -> None:
    """Start the network of the task's torch `side` from the checkpoint of an earlier run (model.weights, found by
    hydrali.core.run.weights_from_run): its network's weights only, a new head when the classes differ."""
    try:
        state = torch.load(start.checkpoint, map_location="cpu", weights_only=True, mmap=True)["state_dict"]
    except Exception as err:  # torch raises many types for a file that is not a checkpoint
        raise HydraliError(f"model.weights={weights}: {start.checkpoint} cannot be read ({first_line(err)})") from err
    prefix = SIDE + "."
    try:
        head = side.initialise_from(
            {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
        )
    except HydraliError as err:
        raise HydraliError(f"model.weights={weights}: {start.checkpoint}: {err}") from err
    start.announce(head)


def compile_network(
    torch_task: torch.nn.Module, *, mode: str = "default", fullgraph: bool = False, dynamic: bool | None = None
) -> torch.nn.Module:
    """torch.compile the task's network (its `model`) in place: its `forward` becomes the compiled one, with no
    wrapper module, so the state_dict keys stay as they are and a checkpoint loads whether it was written compiled
    or not. Training and validation both call the compiled network; the loss and metrics around it run eagerly.
    (nn.Module.compile would compile `__call__`, which TorchDynamo skips for a network made of torch.nn containers
    only, such as an nn.Sequential: nothing would be compiled.) Returns the network."""
    network = torch_task.model
    if not isinstance(network, torch.nn.Module):
        raise HydraliError(
            f"backend.compile=true: the task's torch side ({type(torch_task).__name__}) keeps no "
            f"network (an nn.Module) in `.model` to compile: set backend.compile=false"
        )
    global _compiled_in_process
    if _compiled_in_process:  # an earlier run of this process (a sweep's worker): its compiled code goes, so that
        torch.compiler.reset()  # Dynamo's limit of recompiles per function is not reached by runs; the kept caches stay
    _compiled_in_process = True
    network.forward = torch.compile(network.forward, mode=mode, fullgraph=fullgraph, dynamic=dynamic)
    return network


_compiled_in_process = False  # whether compile_network ran in this process before


def compile_torch_side(torch_task: torch.nn.Module, backend: Any) -> torch.nn.Module:
    """compile_network with the backend settings' compile_mode, compile_fullgraph and compile_dynamic, its compiled
    code kept in and read from backend.compile_cache (hydrali.backends.torch.compile_cache)."""
    compile_cache.use_kept_compiles(backend.compile_cache)
    return compile_network(
        torch_task, mode=str(backend.compile_mode), fullgraph=backend.compile_fullgraph, dynamic=backend.compile_dynamic
    )
