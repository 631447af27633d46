"""Seeds: one global seed for Python and NumPy (each backend seeds its own framework with it as its fit starts),
and one DALI seed per shard derived from it.

DALI pipeline seed = (seed * 1_000_003 + shard_id) mod 2**31: every shard gets its own stream of
random crops and flips, and the same (seed, shard) always gets the same stream.
"""

from __future__ import annotations

import logging
import os
import random
import secrets

log = logging.getLogger(__name__)

_DALI_SEED_MULTIPLIER = 1_000_003  # a prime, so that nearby seeds give unrelated shard seeds
_DALI_SEED_MODULUS = 2**31
_EPOCH_STRIDE = 2**20  # apart from the shards' seeds (fewer than 2**20 shards): no two (shard, epoch) share one


def resolve_seed(seed: int | None) -> int:
    """Return `seed`, or a freshly drawn one when it is None (the runner logs it: announce_drawn). 0 is a seed like
    any other."""
    if seed is None:
        seed = secrets.randbelow(2**31)
    return int(seed)


def announce_drawn(seed: int) -> None:
    """Log the seed that `seed=null` drew, with how to repeat the run."""
    log.info("seed=null: drew seed %d (pass seed=%d to repeat this run)", seed, seed)


def pipeline_seed(seed: int, shard_id: int, start_epoch: int = 0) -> int:
    """The DALI pipeline seed of one shard whose pipeline starts at epoch `start_epoch` (0-based): f(seed, shard_id)
    from the first epoch, stable across runs and backends; another seed for each epoch a run resumes at without
    DALI's saved reader state, so that the resumed epochs do not replay the first epochs' order and augmentations."""
    return (seed * _DALI_SEED_MULTIPLIER + shard_id + start_epoch * _EPOCH_STRIDE) % _DALI_SEED_MODULUS


def seed_everything(seed: int) -> None:
    """Seed Python's and NumPy's generators (a backend seeds its framework's in its fit: Backend.fit)."""
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    import numpy as np

    np.random.seed(seed % 2**32)
