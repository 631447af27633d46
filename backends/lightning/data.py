"""DALI pipelines as Lightning data: one sharded iterator per split, wrapped so Lightning knows the epoch."""
from __future__ import annotations

import lightning as L
from nvidia.dali.plugin.base_iterator import LastBatchPolicy
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from core.errors import HydraliError

LAST_BATCH = {"drop": LastBatchPolicy.DROP, "partial": LastBatchPolicy.PARTIAL, "fill": LastBatchPolicy.FILL}


class DaliLoader:
    """A DALIGenericIterator as Lightning wants a loader: len() is the shard's batches, iter() one epoch.

    A DALI failure (e.g. a corrupt JPEG) becomes a HydraliError naming the files that cannot be
    decoded, looked up only when it happens.
    """

    def __init__(self, iterator: DALIGenericIterator, on_error):
        self.iterator = iterator
        self.on_error = on_error
        self._started = False

    def __len__(self) -> int:
        return len(self.iterator)

    def _next(self) -> dict:
        try:
            return next(self.iterator)[0]
        except StopIteration:
            raise
        except RuntimeError as err:
            raise self.on_error(err) from err

    def __iter__(self):
        # Lightning stops after len() batches without asking for one more, so DALI has not yet
        # seen the end of the epoch: finish it here (auto_reset then rewinds the reader).
        if self._started:
            try:
                while True:
                    self._next()
            except StopIteration:
                pass
        self._started = True
        while True:
            try:
                batch = self._next()
            except StopIteration:
                return
            yield batch


class DaliDataModule(L.LightningDataModule):
    """Builds the train and val DALI pipelines of this process's shard when Lightning sets up."""

    def __init__(self, *, task, cfg, dataset, plan):
        super().__init__()
        self.task, self.cfg, self.dataset, self.plan = task, cfg, dataset, plan
        self.loaders: dict[str, DaliLoader] = {}

    def _loader(self, is_training: bool) -> DaliLoader:
        pipe = self.task.build_pipeline(pipeline=self.cfg.pipeline, data=self.cfg.data, dataset=self.dataset,
                                        plan=self.plan, shard=self.plan.shard, layout="CHW",
                                        is_training=is_training)
        policy = LAST_BATCH[str(self.cfg.pipeline.train_last_batch)] if is_training else LastBatchPolicy.PARTIAL
        try:
            pipe.build()
            iterator = DALIGenericIterator([pipe], list(self.task.outputs), reader_name="Reader",
                                           last_batch_policy=policy, auto_reset=True)
        except RuntimeError as err:
            raise self._decode_error(err) from err
        if len(iterator) == 0:
            split = "train" if is_training else "val"
            raise HydraliError(f"the {split} shard has fewer images than one batch (data.batch_size="
                               f"{self.plan.per_replica_batch}): lower data.batch_size or use "
                               f"pipeline.train_last_batch=partial")
        return DaliLoader(iterator, self._decode_error)

    def _decode_error(self, err: RuntimeError) -> Exception:
        explained = self.task.explain_decode_error(self.dataset)
        return HydraliError(explained) if explained else err

    def setup(self, stage: str) -> None:
        if not self.loaders:
            self.loaders = {"train": self._loader(True), "val": self._loader(False)}

    def train_dataloader(self) -> DaliLoader:
        return self.loaders["train"]

    def val_dataloader(self) -> DaliLoader:
        return self.loaders["val"]
