"""Gathering results across the processes of one job, the same way on every backend.

A backend lends its collective as an `AllGatherBytes`: a function that every process of the job calls at the same
point with its own bytes, and that returns every process's bytes in rank order (torch.distributed's
all_gather_object; TensorFlow's all-reduce through `all_gather_through_sum`). `gather_objects` turns it into a
gather of Python objects. A backend whose processes form one job installs its collective once (`install`), so that
code which does not know its backend (a task's validation) gathers with `gather_objects(obj)` alone.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

AllGatherBytes = Callable[[bytes], list[bytes]]
AllReduceSum = Callable[[np.ndarray], np.ndarray]

WORD = np.dtype(np.int32)  # the unit that a summing collective carries; bytes travel packed into these words

_installed: AllGatherBytes | None = None


def install(all_gather_bytes: AllGatherBytes | None) -> None:
    """Make `all_gather_bytes` the collective that `gather_objects` uses by default in this process (None: none,
    the process is alone)."""
    global _installed
    _installed = all_gather_bytes


def installed() -> AllGatherBytes | None:
    """The collective a backend installed in this process, if any."""
    return _installed


def gather_objects(obj: Any, all_gather_bytes: AllGatherBytes | None = None) -> list[Any]:
    """Every process's `obj` (picklable), in rank order, through `all_gather_bytes` (None: the one installed by
    the backend; `[obj]` when none is, a process alone). Every process of the job calls it at the same point."""
    collective = all_gather_bytes if all_gather_bytes is not None else _installed
    if collective is None:
        return [obj]
    return [pickle.loads(share) for share in collective(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))]


def all_gather_through_sum(all_reduce_sum: AllReduceSum, rank: int, count: int) -> AllGatherBytes:
    """An `AllGatherBytes` for process `rank` of `count`, built on a collective that only sums int32 arrays of one
    shape on every process: each process writes its bytes at its own offset in a buffer of zeros, so that the sum
    holds every process's bytes (one sum for the lengths, one for the bytes)."""

    def gather(data: bytes) -> list[bytes]:
        own = np.zeros(count, WORD)
        own[rank] = len(data)
        lengths = [int(n) for n in all_reduce_sum(own)]
        words = [-(-n // WORD.itemsize) for n in lengths]
        starts = np.concatenate([[0], np.cumsum(words)]).astype(int)
        buffer = np.zeros(int(starts[-1]), WORD)
        padded = data + bytes(words[rank] * WORD.itemsize - len(data))
        buffer[starts[rank] : starts[rank + 1]] = np.frombuffer(padded, WORD)
        total = all_reduce_sum(buffer)
        return [total[starts[r] : starts[r + 1]].tobytes()[: lengths[r]] for r in range(count)]

    return gather
