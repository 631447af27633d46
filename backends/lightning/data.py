"""DALI pipelines as Lightning data: the train and val loaders of this process's shard (hydrali.backends.torch.loaders)
in a LightningDataModule."""

from __future__ import annotations

import lightning as L

from hydrali.backends.torch.loaders import DaliLoader, dali_loader


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
