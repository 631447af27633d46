"""Under torchrun and -m, each process runs the sweep's jobs one after the other, and each job's ranks take rank 0's
run dir and drawn seed through torchrun's agent store (backends/lightning/agreement.py): a rank that asks before
rank 0 has written this job's values waits for them, and never takes the job before's."""

from __future__ import annotations

import multiprocessing
import time
from types import SimpleNamespace

from tests.support.cli import free_ports

RANK0_LATE_S = 1.0  # how long rank 0 of the second job takes to get to the agreement after rank 1


def _rank(rank: int, jobs: list[tuple[str, dict, float]], port: int, results) -> None:
    """One rank of a torchrun job running a sweep: per job (its number, this rank's own values, how late it gets to
    the agreement) the values it takes."""
    import os

    from hydrali.backends.lightning.agreement import share_from_rank0

    os.environ.update(TORCHELASTIC_USE_AGENT_STORE="True", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for job, values, delay in jobs:
        # the two ranks of one node, in the sweep's job `job` (the plan names it: core/run/plan.py's sweep_job)
        plan = SimpleNamespace(global_rank=rank, world_size=2, shards=[0], sweep_job=job)
        time.sleep(delay)
        results.put((rank, job, share_from_rank0(values, plan)))


def test_a_rank_of_a_sweep_s_second_job_takes_that_job_s_values_from_rank_0():
    from torch.distributed import TCPStore

    (port,) = free_ports(1)
    agent = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)  # torchrun's agent store
    first, second = {"output_dir": "/sweep/0", "seed": 11}, {"output_dir": "/sweep/1", "seed": 22}
    own = {"output_dir": "/rank1/own", "seed": 99}  # what rank 1 resolved itself (its own time, its own draw)
    jobs = {0: [("0", first, 0.0), ("1", second, RANK0_LATE_S)], 1: [("0", own, 0.0), ("1", own, 0.0)]}
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=_rank, args=(rank, jobs[rank], port, results)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
    assert [p.exitcode for p in ranks] == [0, 0]
    got = {(rank, job): shared for rank, job, shared in (results.get() for _ in range(4))}
    assert got[(1, "0")] == first
    assert got[(1, "1")] == second, "rank 1 took the job before's run dir and seed"
    del agent
