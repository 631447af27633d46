"""Ranks from MPI launchers (Open MPI's mpirun, MPICH's and Intel MPI's PMI), passed on in torchrun's variables.

An MPI launcher starts and numbers the processes (Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
_LOCAL_SIZE; PMI: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS), but the frameworks read torchrun's
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK). hydrali sets those from the MPI ones, with the
processes laid out node by node (mpirun's default, `--map-by slot`); the address where the processes meet is
the user's, as with torchrun: MASTER_ADDR and MASTER_PORT, passed to every process (`mpirun -x`).
Where the ranks cannot be known, one error names what is missing, instead of every process training alone.
"""

from __future__ import annotations

import os

from hydrali.core.distributed.launchers import (
    FRAMEWORK_RANKS,
    MASTER_ADDR,
    MASTER_PORT,
    MPI_LAUNCHERS,
    TORCHRUN,
    TORCHRUN_GROUP_RANK,
)
from hydrali.core.errors import HydraliError


def torchrun_variables(env: dict) -> dict[str, str]:
    """torchrun's variables for a process an MPI launcher started with more than one process (empty otherwise)."""
    if any(env.get(name) for name in FRAMEWORK_RANKS):  # a framework reads those already: MPI's are left alone
        return {}
    for launcher in MPI_LAUNCHERS:
        size = int(env.get(launcher.world_size) or 1)
        if size <= 1 or not env.get(launcher.rank):
            continue
        missing = [
            name
            for name in (launcher.local_rank, launcher.local_world_size, MASTER_ADDR, MASTER_PORT)
            if not env.get(name)
        ]
        if missing:
            raise HydraliError(
                f"{size} processes were started by {launcher.launcher} but {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not set in them: pass MASTER_ADDR and "
                f"MASTER_PORT to every process (mpirun -x MASTER_ADDR -x MASTER_PORT), or start "
                f"them with torchrun or srun"
            )
        rank, local_rank, local_size = (
            int(env[name]) for name in (launcher.rank, launcher.local_rank, launcher.local_world_size)
        )
        if rank % local_size != local_rank:
            raise HydraliError(
                f"{launcher.launcher} placed rank {rank} as local rank {local_rank} of {local_size}: "
                f"hydrali needs the processes laid out node by node (mpirun --map-by slot)"
            )
        return {
            TORCHRUN.rank: str(rank),
            TORCHRUN.world_size: str(size),
            TORCHRUN.local_rank: str(local_rank),
            TORCHRUN.local_world_size: str(local_size),
            TORCHRUN.node_rank: str(rank // local_size),
            TORCHRUN_GROUP_RANK: str(rank // local_size),
        }
    return {}


def adopt_mpi_ranks(env: dict | None = None) -> None:
    """Set torchrun's variables in this process from its MPI launcher's (see the module's docstring)."""
    env = os.environ if env is None else env
    env.update(torchrun_variables(dict(env)))
