"""Rank 0's start values (run dir, drawn seed) shared with every process of a job that torchrun or srun started,
through torch.distributed's TCPStore, before Lightning sets up its process group.

torchrun: its agent already serves a store at MASTER_ADDR:MASTER_PORT, which its processes may use.
srun, or ranks exported by hand: rank 0 serves a store at the address and port Lightning will use for its
process group (Lightning's cluster environment says which), until every rank has read the values; then it
closes it, and Lightning opens its own there.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.constants import default_pg_timeout

from hydrali.core.distributed.launchers import MASTER_ADDR, MASTER_PORT, TORCHRUN_AGENT_STORE
from hydrali.core.errors import HydraliError

_VALUES, _READ = "values", "read"
_POLL_S = 0.05


def _store_address(env: dict) -> tuple[str, int, bool]:
    """(host, port, whether a launcher's agent serves the store there) for this job's processes."""
    if env.get(TORCHRUN_AGENT_STORE) == "True":
        return env[MASTER_ADDR], int(env[MASTER_PORT]), True
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    for environment in (TorchElasticEnvironment, SLURMEnvironment):
        if environment.detect():
            cluster = environment()
            return cluster.main_address, cluster.main_port, False
    if env.get(MASTER_ADDR) and env.get(MASTER_PORT):
        return env[MASTER_ADDR], int(env[MASTER_PORT]), False
    raise HydraliError(
        "the processes were started with RANK but without MASTER_ADDR and MASTER_PORT: export "
        "both in every process (or start them with torchrun)"
    )


def share_from_rank0(values: dict, plan, timeout: timedelta = default_pg_timeout) -> dict:
    """Rank 0's `values` (JSON-able), on every process of the job (rank 0 gets its own back)."""
    env = dict(os.environ)
    host, port, agent = _store_address(env)
    is_rank0 = plan.global_rank == 0
    processes = plan.world_size // len(plan.shards)
    store = TCPStore(host, port, is_master=is_rank0 and not agent, timeout=timeout, wait_for_workers=False)
    # one scope per attempt of each job: under -m the ranks run the sweep's jobs one after the other against one
    # agent store, and a rank must not read the job before's values while rank 0 has not written this job's yet
    job = plan.sweep_job or "run"
    scoped = PrefixStore(f"hydrali/start/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{job}", store)
    if is_rank0:
        scoped.set(_VALUES, json.dumps(values))
        if not agent:  # the store is rank 0's: keep it until every rank has read (Lightning reuses the port)
            deadline = time.monotonic() + timeout.total_seconds()
            while scoped.add(_READ, 0) < processes - 1:
                if time.monotonic() > deadline:
                    raise HydraliError(
                        f"only {scoped.add(_READ, 0)} of {processes - 1} other ranks reached rank 0 "
                        f"at {host}:{port} in {timeout}: check that every process was started"
                    )
                time.sleep(_POLL_S)
        return values
    shared = json.loads(scoped.get(_VALUES))
    scoped.add(_READ, 1)
    return shared
