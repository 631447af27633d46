"""`backend.devices`: how many devices of a node a job trains on, one key and one rule for every backend.

`auto` is every GPU the framework sees (1 on a machine without one), as Lightning's `devices="auto"` and Keras'
MirroredStrategy take them; a number N is N GPUs, or on a CPU N replicas (N processes on Lightning, N logical CPU
devices on Keras). So the same command line trains on the same number of GPUs, with the same global batch and
learning rate, on every backend; DDP (Lightning) or MirroredStrategy (Keras) follows from the count.
"""

from __future__ import annotations

from typing import Any

from hydrali.core.errors import HydraliError

AUTO = "auto"


def devices_setting(value: Any) -> int | None:
    """backend.devices as typed: a count (at least 1), or None for `auto`; anything else is an error naming it."""
    if str(value).lower() == AUTO:
        return None
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if isinstance(value, bool) or count < 1 or str(count) != str(value).strip():
        raise HydraliError(f"backend.devices={value!r}: give a number of devices (1, 2, ...) or {AUTO}")
    return count


def devices_per_node(value: Any, visible_gpus: int, launched_externally: bool = False) -> int:
    """The devices per node that backend.devices names, on a machine where the framework sees `visible_gpus` GPUs:
    `auto` is every one of them (1 without a GPU); a count above what is visible is an error naming both, unless
    a launcher (torchrun, srun) started the processes, each of which may see only its own GPU."""
    count = devices_setting(value)
    if count is None:
        return max(1, visible_gpus)
    if visible_gpus and count > visible_gpus and not launched_externally:
        raise HydraliError(
            f"backend.devices={count} but this machine shows {visible_gpus} GPU(s): lower backend.devices"
        )
    return count


def slurm_devices(value: Any) -> int:
    """backend.devices as SLURM's tasks and GPUs per node (hydra/launcher=slurm): a count; `auto` cannot be known
    before SLURM allocates the node."""
    count = devices_setting(value)
    if count is None:
        raise HydraliError(
            "hydra/launcher=slurm needs backend.devices=<GPUs per node> (auto is known only on the node)"
        )
    return count
