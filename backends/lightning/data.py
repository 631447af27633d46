"""DALI pipelines as Lightning data: one iterator per split of this process's shard, cut into epochs by
hydrali.core.run.epoch."""

from __future__ import annotations

import lightning as L
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from hydrali.core.data.dali_errors import explain_dali_error
from hydrali.core.run.epoch import EpochContract
from hydrali.core.run.plan import Plan

LAYOUT = "CHW"  # the image layout torch takes (also what core.data.autotune probes with)


class DaliLoader:
    """An endless DALIGenericIterator as Lightning wants a loader: len() and iter() give one epoch of the
    contract. Validation batches are trimmed to their real samples (the shard's padding is dropped), and a
    validation that stopped early is finished first, so that every validation starts at its shard's start."""

    def __init__(self, iterator: DALIGenericIterator, steps: int, on_error, valid=None):
        self.iterator = iterator
        self.steps = steps
        self.on_error = on_error
        self.valid = valid  # valid(step) -> real samples in batch `step`; None: all (training)
        self._position = 0  # batches taken in the current epoch

    def __len__(self) -> int:
        return self.steps

    def _next(self) -> dict:
        try:
            return next(self.iterator)[0]
        except RuntimeError as err:
            raise self.on_error(err) from err

    def __iter__(self):
        if self.valid is not None:
            while self._position % self.steps:  # an interrupted validation: skip to the shard's start
                self._next()
                self._position += 1
        self._position = 0
        for step in range(self.steps):
            batch = self._next()
            self._position = step + 1
            if self.valid is not None:
                keep = self.valid(step)
                batch = {k: v[:keep] for k, v in batch.items()}
            yield batch


def dali_loader(*, task, cfg, dataset, plan: Plan, is_training: bool) -> DaliLoader:
    """The loader of one split of this process's shard: the task's DALI pipeline through DALIGenericIterator, cut
    into epochs by the plan's epoch contract; DALI's errors are explained (hydrali.core.data.dali_errors)."""
    contract: EpochContract = plan.epoch
    shard = plan.shard

    def explain(err: RuntimeError) -> Exception:
        return explain_dali_error(err, lambda: task.explain_decode_error(dataset))

    pipe = task.build_pipeline(
        pipeline=cfg.pipeline,
        data=cfg.data,
        model=cfg.model,
        dataset=dataset,
        plan=plan,
        shard=shard,
        layout=LAYOUT,
        is_training=is_training,
    )
    try:
        pipe.build()
        # endless: the contract counts the steps
        iterator = DALIGenericIterator([pipe], list(task.output_names(is_training)))
    except RuntimeError as err:
        raise explain(err) from err
    if is_training:
        return DaliLoader(iterator, contract.train_steps, explain)
    return DaliLoader(
        iterator, contract.val_steps, explain, valid=lambda step: contract.val_valid(shard.shard_id, step)
    )


class DaliDataModule(L.LightningDataModule):
    """Builds the train and val DALI pipelines of this process's shard when Lightning sets up."""

    def __init__(self, *, task, cfg, dataset, plan):
        super().__init__()
        self.task, self.cfg, self.dataset, self.plan = task, cfg, dataset, plan
        self.loaders: dict[str, DaliLoader] = {}

    def setup(self, stage: str) -> None:
        if not self.loaders:
            self.loaders = {
                split: dali_loader(
                    task=self.task, cfg=self.cfg, dataset=self.dataset, plan=self.plan, is_training=split == "train"
                )
                for split in ("train", "val")
            }

    def train_dataloader(self) -> DaliLoader:
        return self.loaders["train"]

    def val_dataloader(self) -> DaliLoader:
        return self.loaders["val"]
