"""A split decoded once into host memory (a recipe option `decode_once`), and the batches DALI reads from there.

Reading and decoding a 1 KB JPEG costs DALI about as much as the GPU's work on a 32 x 32 image (measured on an H100:
16-18k images/s from CIFAR-10's files whatever the network). For a set of small images that fits in memory, a task
decodes each replica's shard once (the recipe's own reader and decoder: the images its files' pipeline reads, a
training shard drawn from every class) and the recipe then reads its batches from memory through
`fn.external_source`, its augmentations unchanged.

What the batches are, decided here for every backend:

- **Training** is an endless stream over the shard, each pass a fresh permutation drawn from the pipeline's seed and
  the pass's number; a batch may straddle two passes. Batch i is a function of i alone, so that DALI's checkpoint (it
  saves the iteration of a source that takes BatchInfo) resumes the same stream mid-epoch.
- **Validation** reads the shard in order, padded with its last image to `steps` whole batches per pass (as DALI's
  readers pad every shard to the largest one's batches: hydrali.core.run.epoch masks the padding).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np

from hydrali.core.data.pipelines import READER_NAME
from hydrali.core.errors import HydraliError
from hydrali.core.run.epoch import shard_bounds, shard_sizes

log = logging.getLogger("hydrali")


@dataclass(frozen=True, eq=False)
class DecodedImages:
    """One replica's shard of a split, decoded: uint8 images (count, height, width, channels) in the reader's order and
    their int32 labels (count, 1); `largest_shard`: the images of the split's largest shard (validation pads every
    shard to its batches)."""

    images: np.ndarray
    labels: np.ndarray
    largest_shard: int

    def __len__(self) -> int:
        return len(self.images)


def available_memory_bytes() -> int:
    """Physical memory free now on this machine (what the kernel reports available, the page cache reclaimable)."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(count: int, side: int, split: str) -> None:
    """Fail, naming the option, when the `count` images of a whole split, decoded to side x side pixels (RGB, one
    byte a channel), would not fit in the memory free now. The whole split, not one shard: the replicas of a node
    decode their shards at the same time, each before the others have taken their memory."""
    needed, free = count * side * side * 3, available_memory_bytes()
    if needed > free:
        raise HydraliError(
            f"pipeline.options.decode_once=true: the {split} split's {count} images of {side} x {side} "
            f"need {needed / 2**30:.1f} GiB decoded and this machine has {free / 2**30:.1f} GiB free: pass "
            f"pipeline.options.decode_once=false (read and decode the files every epoch) or a smaller data.image_size"
        )


def decode_shard(pipe, *, shard_id: int, num_shards: int, side: int, split: str) -> DecodedImages:
    """Run `pipe` (not built: a pipeline reading the shard of the split that the files' pipeline of this replica
    reads, giving (uint8 HWC images of `side` pixels a side, labels), its reader named as every recipe's) over its
    shard once; the shard decoded."""
    started = time.monotonic()
    pipe.build()
    total = pipe.reader_meta(READER_NAME)["epoch_size"]
    start, end = shard_bounds(total, shard_id, num_shards)
    count = end - start
    check_fits(total, side, split)
    images = np.empty((count, side, side, 3), np.uint8)
    labels = np.empty((count, 1), np.int32)
    batch = pipe.max_batch_size
    for first in range(0, count, batch):
        decoded, classes = pipe.run()
        take = min(batch, count - first)
        images[first : first + take] = _as_array(decoded)[:take]
        labels[first : first + take] = _as_array(classes).reshape(-1, 1)[:take]
    log.info(
        "decoded the %s split's %d images once into memory (%.0f MiB, %.1f s): pipeline.options.decode_once",
        split,
        count,
        images.nbytes / 2**20,
        time.monotonic() - started,
    )
    return DecodedImages(images, labels, largest_shard=max(shard_sizes(total, num_shards)))


KEPT_SHARDS = 2  # decoded shards a process keeps for its next run: a sweep's worker (or an in-process sweep) reads
#   the same training and validation shards again in its next job of another lr
_kept: OrderedDict = OrderedDict()  # key -> (split, DecodedImages), the newest last


def kept_or_decoded(key: Hashable, decode: Callable[[], DecodedImages], split: str) -> DecodedImages:
    """The shard that `key` names (everything that decides its images and their order: the source with its files and
    shard, the image size and padding, the decoder), decoded by `decode()` unless this process
    decoded it for an earlier run (the next job of a sweep in the same worker), then kept for the next one."""
    if key in _kept:
        _kept.move_to_end(key)
        log.info("the %s split decoded once by an earlier run of this process, kept in memory", split)
        return _kept[key][1]
    for other in [k for k, (of_split, _) in _kept.items() if of_split == split]:
        del _kept[other]  # freed before decoding: the memory check and the decode see only what this run needs
    decoded = decode()
    _kept[key] = (split, decoded)
    while len(_kept) > KEPT_SHARDS:
        _kept.popitem(last=False)
    return decoded


def _as_array(outputs) -> np.ndarray:
    """A DALI batch (on the CPU or the GPU) as one NumPy array."""
    return np.asarray((outputs.as_cpu() if hasattr(outputs, "as_cpu") else outputs).as_array())


class DecodedBatches:
    """The batch sources over a DecodedImages of two `fn.external_source`s (batch=True, batch_info=True): batch i's
    images and labels of the training stream or of the validation passes (see the module's docstring)."""

    def __init__(self, decoded: DecodedImages, *, batch: int, seed: int, is_training: bool):
        self.decoded, self.batch, self.seed, self.is_training = decoded, batch, seed, is_training
        self.val_steps = math.ceil(decoded.largest_shard / batch)  # batches per validation pass, padded
        self._permutations: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()  # DALI's TensorFlow plugin calls the two sources from threads of its own

    def _permutation(self, pass_index: int) -> np.ndarray:
        """The shard's order in training pass `pass_index` (a few recent ones kept: a batch may span several)."""
        with self._lock:
            if pass_index not in self._permutations:
                rng = np.random.default_rng([self.seed, pass_index])
                self._permutations[pass_index] = rng.permutation(len(self.decoded))
                for old in [p for p in self._permutations if p < pass_index - 2]:
                    self._permutations.pop(old, None)
            return self._permutations[pass_index]

    def indices(self, iteration: int) -> np.ndarray:
        """The shard's images in batch `iteration` (counted from the pipeline's start)."""
        count = len(self.decoded)
        if not self.is_training:
            step = iteration % self.val_steps
            return np.minimum(np.arange(step * self.batch, (step + 1) * self.batch), count - 1)
        positions = np.arange(iteration * self.batch, (iteration + 1) * self.batch)
        passes = positions // count
        order = np.empty_like(positions)
        for pass_index in np.unique(passes):
            here = passes == pass_index
            order[here] = self._permutation(int(pass_index))[positions[here] % count]
        return order

    def images(self, info) -> np.ndarray:
        """Batch `info`'s images (info: DALI's BatchInfo, or the iteration): one external source's."""
        return self.decoded.images[self.indices(_iteration(info))]

    def labels(self, info) -> np.ndarray:
        """Batch `info`'s labels: another external source's (DALI's TensorFlow plugin feeds each source apart)."""
        return self.decoded.labels[self.indices(_iteration(info))]


def _iteration(info) -> int:
    return info if isinstance(info, int) else info.iteration
