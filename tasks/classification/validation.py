"""One validation of the classification task, framework-neutral: each sample's top-1 class in, top-1 accuracy out.

Both backends' framework sides feed it NumPy arrays (each process its own shard): the class each sample's largest
logit names (taken on the device, so that one integer a sample leaves it), its true class, and on a backend whose
validation batches keep the shard's padding, each sample's weight (0: padding, not scored). The sides gather what
every process counted (`gather_across_processes`, through hydrali.core.distributed.gather) and call `finish` once
per validation: every process then reports the accuracy over the whole validation set.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from hydrali.core.distributed.gather import AllGatherBytes, gather_objects

ACCURACY = "val/acc"  # the metric's name, the same on every backend


class ClassificationValidation:
    """Counts one validation's samples and top-1 hits, on this process or, once gathered, on every process."""

    def __init__(self):
        # the replicas of one Keras process add their batches from TensorFlow's threads, possibly at once
        self._lock = threading.Lock()
        self.hits = 0  # samples whose top-1 class is their true class
        self.samples = 0  # real samples seen (the shard's padding not counted)

    def reset(self) -> None:
        """Forget the batches added: a new validation starts (e.g. after Lightning's sanity check)."""
        with self._lock:
            self.hits, self.samples = 0, 0

    def add_batch(self, predicted: Any, labels: Any, weights: Any | None = None) -> int:
        """Add one batch: each sample's top-1 class index (`predicted`), its true class index (`labels`, any shape
        of one value a sample) and its weight (`weights`: 0 for the shard's padding, which is skipped; None: every
        sample is real). Return the number of real samples added."""
        predicted = np.asarray(predicted).reshape(-1)
        labels = np.asarray(labels).reshape(-1)
        if predicted.shape != labels.shape:
            raise ValueError(f"{predicted.size} predicted classes for {labels.size} labels: one each per sample")
        hit = predicted == labels
        if weights is None:
            hits, samples = int(np.count_nonzero(hit)), int(hit.size)
        else:
            real = np.asarray(weights).reshape(-1) > 0
            if real.shape != hit.shape:
                raise ValueError(f"{real.size} weights for {hit.size} samples: one each per sample")
            hits, samples = int(np.count_nonzero(hit & real)), int(np.count_nonzero(real))
        with self._lock:
            self.hits += hits
            self.samples += samples
        return samples

    def collected(self) -> tuple[int, int]:
        """What this process counted, to share with the others: (hits, samples)."""
        return self.hits, self.samples

    def add_collected(self, shares: Sequence[tuple[int, int]]) -> None:
        """Add what other processes counted (each a `collected()`)."""
        with self._lock:
            for hits, samples in shares:
                self.hits += int(hits)
                self.samples += int(samples)

    def gather_across_processes(self, all_gather_bytes: AllGatherBytes | None = None) -> None:
        """Hold the counts of every process instead of this process's own: through `all_gather_bytes` (None: the
        collective the backend installed; none: this process alone). Every process of the job calls it at the same
        point."""
        shares = gather_objects(self.collected(), all_gather_bytes)
        if len(shares) > 1:  # a process alone holds its own already
            self.reset()
            self.add_collected(shares)

    def finish(self, epoch: int) -> dict[str, float]:
        """{"val/acc": the top-1 accuracy of what was added} (not a number when no sample was), then starts afresh.
        `epoch` (counted from 0) is the validated epoch's, as for every task's validation."""
        accuracy = self.hits / self.samples if self.samples else float("nan")
        self.reset()
        return {ACCURACY: float(accuracy)}
