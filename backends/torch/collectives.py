"""torch.distributed's collective as hydrali.core.distributed.gather's `AllGatherBytes`: installed by a torch backend
(the Lightning backend) for its run, so that a task's validation gathers across DDP processes without knowing
torch.distributed."""

from __future__ import annotations

import torch.distributed as dist


def all_gather_bytes(data: bytes) -> list[bytes]:
    """Every process's `data`, in rank order, through torch.distributed (just this one's outside DDP)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [data]
    shares = [b""] * dist.get_world_size()
    dist.all_gather_object(shares, data)
    return shares
