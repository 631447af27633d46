"""Every launcher's environment variables, in one table: what tells a process its rank, the job's size, its place
on its node, and where the job meets. Every module that reads or writes them takes their names from here.

torchrun's variables are the lingua franca: the frameworks read them, hydrali's own launch sets them
(core/distributed/local_launch.py), and MPI launchers' ranks are translated into them (mpi_ranks.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LauncherVariables:
    """The variables one launcher sets in each process it starts (None: it sets no such variable)."""

    launcher: str  # how messages name it
    rank: str  # the process's global rank
    world_size: str  # the number of processes of the job
    local_rank: str  # its rank on its node
    local_world_size: str | None  # the number of the job's processes on its node
    node_rank: str | None  # its node's rank


TORCHRUN = LauncherVariables(
    "torchrun",
    rank="RANK",
    world_size="WORLD_SIZE",
    local_rank="LOCAL_RANK",
    local_world_size="LOCAL_WORLD_SIZE",
    node_rank="NODE_RANK",
)
TORCHRUN_GROUP_RANK = "GROUP_RANK"  # torchrun's other name for the node rank
TORCHRUN_RUN_ID = "TORCHELASTIC_RUN_ID"  # set by torchrun in every process it starts
TORCHRUN_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # "True": torchrun's agent serves the store at MASTER_ADDR
SLURM = LauncherVariables(
    "srun",
    rank="SLURM_PROCID",
    world_size="SLURM_NTASKS",
    local_rank="SLURM_LOCALID",
    local_world_size=None,
    node_rank="SLURM_NODEID",
)
SLURM_NODES = "SLURM_NNODES"  # the job's nodes
SLURM_STEP_TASKS = "SLURM_STEP_NUM_TASKS"  # the tasks of this srun step (the job's may differ)
SLURM_STEP_NODES = "SLURM_STEP_NUM_NODES"  # the nodes of this srun step
OPEN_MPI = LauncherVariables(
    "Open MPI (mpirun)",
    rank="OMPI_COMM_WORLD_RANK",
    world_size="OMPI_COMM_WORLD_SIZE",
    local_rank="OMPI_COMM_WORLD_LOCAL_RANK",
    local_world_size="OMPI_COMM_WORLD_LOCAL_SIZE",
    node_rank=None,
)
PMI = LauncherVariables(
    "a PMI launcher (MPICH, Intel MPI)",
    rank="PMI_RANK",
    world_size="PMI_SIZE",
    local_rank="MPI_LOCALRANKID",
    local_world_size="MPI_LOCALNRANKS",
    node_rank=None,
)
MPI_LAUNCHERS = (OPEN_MPI, PMI)
TF_CONFIG = "TF_CONFIG"  # TensorFlow's cluster JSON: Keras workers
MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"  # where the job's processes meet (torch.distributed)
LAUNCHED_BY_HYDRALI = "HYDRALI_LAUNCHED"  # set in the processes hydrali starts itself
PROCESS_PORTS = "HYDRALI_PROCESS_PORTS"  # in those processes, on one node: a free port per process, in rank order
#   (for a framework whose processes each listen on one: TensorFlow's workers)
LAUNCHER_PID = "HYDRALI_LAUNCHER_PID"  # in those processes: the process that started them (they end with it)

# Any of these in a process's environment: a launcher started it, and neither a framework nor hydrali starts more.
STARTED_BY_A_LAUNCHER = (TORCHRUN_RUN_ID, SLURM.rank, TORCHRUN.local_rank, OPEN_MPI.rank, PMI.rank, TF_CONFIG)
# Set in every process, rank 0's included, by the launchers whose processes compose their config apart: torchrun
# (or RANK exported by hand), srun, TensorFlow's multi-worker config; then the processes agree on rank 0's run dir
# and seed (core/distributed/agreement.py). Lightning's own launcher passes the run dir on and sets no RANK.
RANKED_BY_A_LAUNCHER = (TORCHRUN.rank, SLURM.rank, TF_CONFIG)
# Ranks a framework reads itself (torchrun's, SLURM's): they win over TF_CONFIG and MPI's.
FRAMEWORK_RANKS = (TORCHRUN.rank, SLURM.rank)
# What places a process on its node (all 0: the job's first process).
PLACEMENT = (
    TORCHRUN.rank,
    SLURM.rank,
    TORCHRUN.local_rank,
    SLURM.local_rank,
    TORCHRUN.node_rank,
    TORCHRUN_GROUP_RANK,
    SLURM.node_rank,
)
