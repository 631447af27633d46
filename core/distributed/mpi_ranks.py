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
from dataclasses import dataclass

from hydrali.core.errors import HydraliError


@dataclass(frozen=True)
class MpiLauncher:
    """The variables one family of MPI launchers sets in each process."""
    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str


MPI_LAUNCHERS = (
    MpiLauncher("Open MPI (mpirun)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE"),
    MpiLauncher("a PMI launcher (MPICH, Intel MPI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)
TORCHRUN_RANK = ("RANK", "SLURM_PROCID")   # ranks a framework reads already: then MPI's are left alone


def torchrun_variables(env: dict) -> dict[str, str]:
    """torchrun's variables for a process an MPI launcher started with more than one process (empty otherwise)."""
    if any(env.get(name) for name in TORCHRUN_RANK):
        return {}
    for launcher in MPI_LAUNCHERS:
        size = int(env.get(launcher.size) or 1)
        if size <= 1 or not env.get(launcher.rank):
            continue
        missing = [name for name in (launcher.local_rank, launcher.local_size, "MASTER_ADDR", "MASTER_PORT")
                   if not env.get(name)]
        if missing:
            raise HydraliError(f"{size} processes were started by {launcher.name} but {', '.join(missing)} "
                               f"{'is' if len(missing) == 1 else 'are'} not set in them: pass MASTER_ADDR and "
                               f"MASTER_PORT to every process (mpirun -x MASTER_ADDR -x MASTER_PORT), or start "
                               f"them with torchrun or srun")
        rank, local_rank, local_size = (int(env[name]) for name in (launcher.rank, launcher.local_rank,
                                                                     launcher.local_size))
        if rank % local_size != local_rank:
            raise HydraliError(f"{launcher.name} placed rank {rank} as local rank {local_rank} of {local_size}: "
                               f"hydrali needs the processes laid out node by node (mpirun --map-by slot)")
        return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(local_size), "NODE_RANK": str(rank // local_size),
                "GROUP_RANK": str(rank // local_size)}
    return {}


def adopt_mpi_ranks(env: dict | None = None) -> None:
    """Set torchrun's variables in this process from its MPI launcher's (see the module's docstring)."""
    env = os.environ if env is None else env
    env.update(torchrun_variables(dict(env)))
