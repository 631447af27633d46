"""The epoch steps: how many steps an epoch has and which samples count, decided once for every backend.

From the dataset's counts (known from the task's scan, before any pipeline exists), the number
of shards (one per replica) and the per-replica batch:

- **Shards** are DALI's: shard s of S holds samples [floor(N*s/S), floor(N*(s+1)/S)), so their
  sizes differ by at most one.
- **Training** reads an endless, shuffled stream per replica (the reader does not pad; at the end of
  its data it goes on with the next pass) and every backend takes `train_steps` batches from it per
  epoch: `drop` (the default) takes the whole batches of the smallest shard, floor(min/B), so the
  first epoch repeats no sample and the replicas' shards are disjoint; `fill` takes ceil(max/B). What
  an epoch leaves of a pass starts the next epoch, so later epochs may straddle two passes (as with
  any endless DALI dataset). Every replica takes the same number of steps. With gradient accumulation
  over A batches (optim.accumulate_grad_batches) an epoch is a whole number of accumulations: its batches
  are rounded down to a multiple of A (what is left goes to the next epoch, as above), so that every
  backend takes `optimizer_steps` = train_steps / A optimizer steps an epoch and none spans two epochs.
- **Validation** reads each shard once per validation, padded by DALI (the shard's last sample
  repeated) to `val_steps` = ceil(max/B) whole batches on every replica; the padded samples are
  masked: `val_valid(shard, step)` samples of a batch count. Each image is scored exactly once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hydrali.core.config.schema import LastBatch
from hydrali.core.errors import HydraliError

TRAIN_STEPS = {  # pipeline.train_last_batch -> training steps per epoch from the shards' sizes and the batch
    LastBatch.drop: lambda sizes, batch: min(sizes) // batch,
    LastBatch.fill: lambda sizes, batch: math.ceil(max(sizes) / batch),
}


def shard_bounds(num_samples: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """The [start, end) sample range of shard `shard_id` of `num_shards`, as DALI's readers split it."""
    return num_samples * shard_id // num_shards, num_samples * (shard_id + 1) // num_shards


def shard_sizes(num_samples: int, num_shards: int) -> tuple[int, ...]:
    """The number of samples in each shard."""
    return tuple(end - start for start, end in (shard_bounds(num_samples, s, num_shards) for s in range(num_shards)))


@dataclass(frozen=True)
class EpochSteps:
    """Steps and counted samples of one epoch, the same on every backend and every replica."""

    train_samples: int  # images in the training split
    val_samples: int  # images in the validation split
    num_shards: int  # replicas in the whole job
    batch: int  # per replica
    last_batch: str  # a LastBatch value: the policy of the training epoch's last batch
    accumulate: int = 1  # batches per optimizer step (optim.accumulate_grad_batches)

    @property
    def train_steps(self) -> int:
        """Training batches per epoch, the same on every replica: a whole number of accumulations."""
        batches = TRAIN_STEPS[LastBatch(self.last_batch)](shard_sizes(self.train_samples, self.num_shards), self.batch)
        return batches - batches % self.accumulate

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per epoch (what the lr schedule counts)."""
        return self.train_steps // self.accumulate

    @property
    def train_images_per_epoch(self) -> int:
        """Images trained on per epoch by all replicas together."""
        return self.train_steps * self.batch * self.num_shards

    @property
    def val_steps(self) -> int:
        """Validation batches per replica (the last ones padded, the padding masked)."""
        return math.ceil(max(shard_sizes(self.val_samples, self.num_shards)) / self.batch)

    def val_shard_size(self, shard_id: int) -> int:
        """Real (unpadded) validation samples in shard `shard_id`."""
        start, end = shard_bounds(self.val_samples, shard_id, self.num_shards)
        return end - start

    def val_valid(self, shard_id: int, step: int) -> int:
        """How many leading samples of validation batch `step` (0-based) of a shard are real, not padding."""
        return max(0, min(self.batch, self.val_shard_size(shard_id) - step * self.batch))

    def params(self) -> dict:
        """What is logged to MLflow about the epoch."""
        return {
            "epoch/steps_per_epoch": self.train_steps,
            "epoch/optimizer_steps_per_epoch": self.optimizer_steps,
            "epoch/train_images_per_epoch": self.train_images_per_epoch,
            "epoch/val_steps": self.val_steps,
            "epoch/last_batch": self.last_batch,
        }


def make_epoch_steps(
    *, train_samples: int, val_samples: int, num_shards: int, batch: int, last_batch: str, accumulate: int = 1
) -> EpochSteps:
    """The epoch steps of a run; a split too small for its shards and batch is an error saying what to change."""
    last_batch = LastBatch.of(last_batch, "pipeline.train_last_batch").value
    contract = EpochSteps(train_samples, val_samples, num_shards, batch, last_batch, accumulate)
    smallest = min(shard_sizes(train_samples, num_shards))
    batches = EpochSteps(train_samples, val_samples, num_shards, batch, last_batch).train_steps
    if batches > 0 and smallest > 0 and contract.train_steps == 0:
        raise HydraliError(
            f"optim.accumulate_grad_batches={accumulate} is more than the {batches} batch(es) of {batch} images an "
            f"epoch has per replica: lower optim.accumulate_grad_batches to at most {batches}, or data.batch_size"
        )
    if contract.train_steps == 0 or smallest == 0:
        over = f" over {num_shards} replicas a shard holds {smallest}," if num_shards > 1 else ""
        raise HydraliError(
            f"data.batch_size={batch} is larger than a shard: the train split has {train_samples} images,"
            f"{over} fewer than one batch: lower data.batch_size to at most {max(1, smallest)}"
            + (" or use fewer replicas" if num_shards > 1 else "")
        )
    if min(shard_sizes(val_samples, num_shards)) == 0:
        raise HydraliError(
            f"the val split has {val_samples} images, fewer than the {num_shards} replicas: "
            f"use fewer replicas or a larger val split"
        )
    return contract
