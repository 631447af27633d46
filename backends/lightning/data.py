"""DALI pipelines as Lightning data: the train and val loaders of this process's shard (hydrali.backends.torch.loaders)
in a LightningDataModule."""

from __future__ import annotations

import lightning as L

from hydrali.backends.torch.loaders import DaliLoader, dali_loader
from hydrali.core.contracts.run import RunContract


class DaliDataModule(L.LightningDataModule):
    """Builds the train and val DALI pipelines of this process's shard when Lightning sets up."""

    def __init__(self, *, task, contract: RunContract, dataset):
        super().__init__()
        self.task, self.contract, self.dataset = task, contract, dataset
        self.loaders: dict[str, DaliLoader] = {}

    def setup(self, stage: str) -> None:
        if not self.loaders:
            self.loaders = {
                split: dali_loader(
                    task=self.task, contract=self.contract, dataset=self.dataset, is_training=split == "train"
                )
                for split in ("train", "val")
            }

    def train_dataloader(self) -> DaliLoader:
        return self.loaders["train"]

    def val_dataloader(self) -> DaliLoader:
        return self.loaders["val"]
