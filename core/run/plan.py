"""The plan of a run: everything both backends must agree on, computed once in core.

global batch = per-replica batch x world size x batches accumulated per optimizer step (the images of one step),
    or data.global_batch where a config fixes it: the per-replica batch is then derived from it, so that a recipe
    trains the same optimizer steps on any number of replicas
effective lr = optim.lr x rule(global batch / optim.ref_batch), rule: SCALE_RULES[optim.scale]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from hydrali.core.config.schema import Scale
from hydrali.core.distributed.topology import Topology
from hydrali.core.errors import HydraliError
from hydrali.core.policies.seeding import pipeline_seed
from hydrali.core.process import job_context
from hydrali.core.run.epoch import EpochSteps, make_epoch_steps

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from hydrali.core.contracts.task import Dataset

SCALE_RULES = {  # optim.scale -> the lr's factor as a function of global batch / ref_batch; one rule per Scale
    Scale.linear: lambda ratio: ratio,
    Scale.sqrt: math.sqrt,
    Scale.none: lambda ratio: 1.0,
}


def scaled_lr(base_lr: float, global_batch: int, ref_batch: int, rule: str) -> float:
    """The learning rate for `global_batch`, given `base_lr` tuned for `ref_batch`."""
    scale = Scale.of(rule, "optim.scale")
    if ref_batch < 1:
        raise HydraliError(f"optim.ref_batch={ref_batch}: it must be a positive batch size")
    return base_lr * SCALE_RULES[scale](global_batch / ref_batch)


@dataclass(frozen=True)
class Shard:
    """One replica's input: which DALI shard it reads, on which device, with which seed."""

    shard_id: int
    device_id: int | None  # the node-local GPU; None on the CPU
    pipeline_seed: int


@dataclass(frozen=True)
class Plan:
    """What a backend receives: ranks, shard, batch sizes, learning rate, seeds, device."""

    world_size: int  # replicas in the whole job
    global_rank: int  # this process's rank (0 tracks and writes the summary)
    local_rank: int
    node_rank: int
    shards: tuple[Shard, ...]  # one per replica this process drives
    num_shards: int
    per_replica_batch: int
    global_batch: int  # images per optimizer step: per-replica batch x world size x accumulate
    base_lr: float
    effective_lr: float
    lr_scale_rule: str
    warmup_epochs: float
    epochs: int
    seed: int
    device: str  # "cpu" or "gpu": where DALI runs (the backend decides where the model trains)
    accumulate: int = 1  # batches whose mean gradient makes one optimizer step (optim.accumulate_grad_batches)
    epoch: EpochSteps | None = None  # steps and counted samples per epoch (core.run.epoch), set by the runner
    sweep_job: str | None = None  # the job's number under -m (hydra.job.num); None: a single run

    @property
    def images_per_batch(self) -> int:
        """Images all replicas train on per batch (an optimizer step takes `accumulate` of these)."""
        return self.per_replica_batch * self.world_size

    @property
    def shard(self) -> Shard:
        """The shard of a one-replica process (Lightning DDP)."""
        if len(self.shards) != 1:
            raise ValueError(f"this process drives {len(self.shards)} replicas; pick one of plan.shards")
        return self.shards[0]

    def resumed_at(self, epoch: int) -> Plan:
        """This plan for pipelines that start at epoch `epoch` of a resumed run without DALI's saved reader state:
        each shard's pipeline seed of that epoch (core.policies.seeding.pipeline_seed)."""
        shards = tuple(replace(s, pipeline_seed=pipeline_seed(self.seed, s.shard_id, epoch)) for s in self.shards)
        return replace(self, shards=shards)

    def params(self) -> dict:
        """The values logged to MLflow, under `plan/`."""
        keep = (
            "world_size",
            "per_replica_batch",
            "global_batch",
            "accumulate",
            "base_lr",
            "effective_lr",
            "lr_scale_rule",
            "warmup_epochs",
            "epochs",
            "seed",
            "device",
        )
        params = {f"plan/{k}": v for k, v in asdict(self).items() if k in keep}
        return {**params, **(self.epoch.params() if self.epoch else {})}


def per_replica_batch(global_batch: int, world_size: int, accumulate: int) -> int:
    """Each replica's batch when a config fixes the global batch (data.global_batch) at `world_size` replicas, each
    accumulating `accumulate` batches per optimizer step; one line naming the key when it does not divide."""
    shares = world_size * accumulate
    accumulated = f" x {accumulate} accumulated batches" if accumulate > 1 else ""
    if global_batch < 1:
        raise HydraliError(f"data.global_batch={global_batch}: pass at least 1 (images per optimizer step), or null")
    if global_batch % shares:
        raise HydraliError(
            f"data.global_batch={global_batch} does not divide into {world_size} replica(s){accumulated}: pass a "
            f"multiple of {shares}, or data.global_batch=null to take data.batch_size per replica"
        )
    return global_batch // shares


def make_plan(
    *,
    topology: Topology,
    batch_size: int,
    base_lr: float,
    ref_batch: int,
    rule: str,
    warmup_epochs: float,
    epochs: int,
    seed: int,
    device: str,
    accumulate: int = 1,
    global_batch: int | None = None,
) -> Plan:
    """Build the plan for this process from its topology and the user's settings (`global_batch`: the images of an
    optimizer step fixed by the config, None: `batch_size` per replica)."""
    if accumulate < 1:
        raise HydraliError(f"optim.accumulate_grad_batches={accumulate}: it must be at least 1")
    if global_batch is not None:
        batch_size = per_replica_batch(global_batch, topology.world_size, accumulate)
    if batch_size < 1:
        raise HydraliError(f"data.batch_size={batch_size}: it must be at least 1")
    if epochs < 1:
        raise HydraliError(f"epochs={epochs}: it must be at least 1")
    if warmup_epochs < 0:
        raise HydraliError(f"optim.warmup_epochs={warmup_epochs}: it cannot be negative")
    global_batch = batch_size * topology.world_size * accumulate
    return Plan(
        world_size=topology.world_size,
        global_rank=topology.global_rank,
        local_rank=topology.local_rank,
        node_rank=topology.node_rank,
        shards=tuple(
            Shard(shard_id, None if device == "cpu" else local, pipeline_seed(seed, shard_id))
            for shard_id, local in zip(topology.shard_ids, topology.local_replicas)
        ),
        num_shards=topology.num_shards,
        per_replica_batch=batch_size,
        global_batch=global_batch,
        base_lr=base_lr,
        effective_lr=scaled_lr(base_lr, global_batch, ref_batch, rule),
        lr_scale_rule=rule,
        warmup_epochs=warmup_epochs,
        epochs=epochs,
        seed=seed,
        device=device,
        accumulate=accumulate,
        sweep_job=job_context.current().num,
    )


def plan_of_config(cfg: DictConfig, topology: Topology, *, seed: int, device: str, training: bool = True) -> Plan:
    """make_plan with the config's batch and lr settings for this process's `topology` (no epoch steps);
    `training=False` (eval, predict, export): batches of data.batch_size, whatever data.global_batch fixes for
    training."""
    return make_plan(
        topology=topology,
        batch_size=cfg.data.batch_size,
        base_lr=cfg.optim.lr,
        ref_batch=cfg.optim.ref_batch,
        rule=str(cfg.optim.scale),
        warmup_epochs=cfg.optim.warmup_epochs,
        epochs=cfg.epochs,
        seed=seed,
        device=device,
        accumulate=int(cfg.optim.get("accumulate_grad_batches", 1)),
        global_batch=cfg.data.get("global_batch") if training else None,
    )


def plan_run(cfg: DictConfig, topology: Topology, dataset: Dataset, *, seed: int, device: str) -> Plan:
    """The plan of a run in one call: batch, lr and seed rules from the config's settings for this process's
    `topology`, and the epoch steps from the dataset's counts (DALI on `device`)."""
    plan = plan_of_config(cfg, topology, seed=seed, device=device)
    contract = make_epoch_steps(
        train_samples=dataset.num_train,
        val_samples=dataset.num_val,
        num_shards=plan.num_shards,
        batch=plan.per_replica_batch,
        last_batch=str(cfg.pipeline.train_last_batch),
        accumulate=plan.accumulate,
    )
    return replace(plan, epoch=contract)
