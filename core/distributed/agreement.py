"""What the processes of one job decide once: rank 0's run dir and drawn seed, shared with every rank.

Under torchrun, srun or TF_CONFIG workers each process composes the config itself: each resolves
`${now:...}` in hydra.run.dir and draws its own seed for `seed=null`, so ranks could write to different
run dirs and train with different seeds. The backend shares rank 0's values through its own means
(`share_from_rank0`: torch.distributed's TCPStore, TensorFlow's collectives); the other ranks take them,
remove the empty run dir Hydra made for them, and log into rank 0's dir (<job name>_rank<N>.log).
The processes hydrali starts itself (hydrali.core.distributed.local_launch) read the job's resolved config: they agree
already.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from hydrali.core.distributed.launchers import LAUNCHED_BY_HYDRALI, RANKED_BY_A_LAUNCHER
from hydrali.core.errors import HydraliError, first_line
from hydrali.core.run.run_dir import remove_if_empty
from hydrali.core.tracking.run_files import DeferredFileHandler

log = logging.getLogger("hydrali")


@dataclass(frozen=True)
class StartValues:
    """What a run resolves at its start and its ranks must share."""

    output_dir: str
    seed: int


def needed(processes: int, env: dict | None = None) -> bool:
    """Whether this process is one of several an outside launcher started (they resolved their config apart)."""
    env = os.environ if env is None else env
    return processes > 1 and not env.get(LAUNCHED_BY_HYDRALI) and any(env.get(name) for name in RANKED_BY_A_LAUNCHER)


def agree(share_from_rank0, own: StartValues, plan) -> StartValues:
    """Rank 0's start values, got through the backend's `share_from_rank0(values: dict, plan) -> dict`."""
    try:
        shared = share_from_rank0({"output_dir": own.output_dir, "seed": own.seed}, plan)
    except HydraliError:
        raise
    except Exception as err:  # a rank that cannot reach rank 0: one line, naming what to check
        raise HydraliError(
            f"rank {plan.global_rank} could not share the run dir and seed with the job's other ranks "
            f"({first_line(err)}): check the launcher's settings, the same for every process"
        ) from err
    return StartValues(output_dir=str(shared["output_dir"]), seed=int(shared["seed"]))


def move_to_run_dir(own_dir: Path, agreed_dir: Path, rank: int) -> None:
    """Make this process (rank > 0) write into rank 0's run dir: its log file becomes
    <agreed dir>/<name>_rank<rank>.log, and the empty dir Hydra made for it, if another, goes."""
    if rank == 0:
        return
    agreed_dir.mkdir(parents=True, exist_ok=True)  # a node that does not share rank 0's file system
    for handler in logging.getLogger().handlers:
        if isinstance(handler, DeferredFileHandler):
            stem, suffix = os.path.splitext(os.path.basename(handler.baseFilename))
            handler.baseFilename = os.path.abspath(agreed_dir / f"{stem}_rank{rank}{suffix}")
    if own_dir.resolve() != agreed_dir.resolve():
        remove_if_empty(own_dir)
        log.info("rank %d writes into rank 0's run dir %s", rank, agreed_dir)
