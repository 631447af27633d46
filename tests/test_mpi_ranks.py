"""Processes started by mpirun (Open MPI) or a PMI launcher train at their ranks, or are refused in one line."""

import pytest

from hydrali.core.distributed.mpi_ranks import torchrun_variables
from hydrali.core.distributed.topology import detect_topology
from hydrali.core.errors import HydraliError

MEET = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def _open_mpi(rank: int, size: int = 4, per_node: int = 2) -> dict:
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % per_node),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(per_node),
    }


def test_open_mpi_ranks_over_two_nodes_read_each_its_own_shard():
    shards = []
    for rank in range(4):  # detect_topology reads mpirun's variables itself
        topo = detect_topology(2, 2, env={**_open_mpi(rank), **MEET})
        assert (topo.global_rank, topo.node_rank, topo.local_rank) == (rank, rank // 2, rank % 2)
        assert topo.num_shards == 4
        shards.append(topo.shard_id)
    assert shards == [0, 1, 2, 3]


def test_pmi_ranks_are_read_too():
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", **MEET}
    assert torchrun_variables(env) == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "0",
        "GROUP_RANK": "0",
    }


@pytest.mark.parametrize(
    "env,message",
    [
        (_open_mpi(1), "4 processes were started by Open MPI.*MASTER_ADDR, MASTER_PORT are not set"),
        (
            {"PMI_RANK": "1", "PMI_SIZE": "2", **MEET},
            "2 processes were started by .*MPI_LOCALRANKID, MPI_LOCALNRANKS are not set.*torchrun or srun",
        ),
    ],
)
def test_ranks_that_cannot_be_known_are_one_error_naming_what_is_missing(env, message):
    with pytest.raises(HydraliError, match=message):
        torchrun_variables(env)


def test_ranks_not_laid_out_node_by_node_are_refused_and_torchrun_ranks_win():
    with pytest.raises(HydraliError, match="--map-by slot"):
        torchrun_variables({**_open_mpi(1), "OMPI_COMM_WORLD_LOCAL_RANK": "0", **MEET})
    assert torchrun_variables({**_open_mpi(1), **MEET, "RANK": "1"}) == {}, "torchrun's (or srun's) ranks are read"
    assert torchrun_variables({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}) == {}, "one process"
