"""task=brightness on torch: its network, and its side (hydrali.core.contracts.task.TorchSide): loss, metric."""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn
from torch.nn import functional as F
from torchmetrics import MeanMetric

from hydrali.core.contracts.task import TorchSideDefaults
from hydrali.tasks.base import instantiate_network, network_spec


class BrightnessNet(nn.Sequential):
    """One convolution, global average pooling and a linear head (conf/model/brightness_net.yaml)."""

    def __init__(self, num_classes: int, width: int = 8):
        super().__init__(
            nn.Conv2d(3, width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(width, num_classes),
        )


class TorchBrightness(nn.Module, TorchSideDefaults):
    """The torch side: cross-entropy, and the validation error rate (val/error) over every process."""

    prediction_names = ("logits",)

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.error = MeanMetric()

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, int]:
        """Cross-entropy of one training batch, and its size."""
        labels = batch["labels"].reshape(-1).long()
        return F.cross_entropy(self.model(batch["images"]), labels), labels.numel()

    def validation_step(self, batch: dict) -> tuple[torch.Tensor, int]:
        """Cross-entropy of one validation batch and its size; its errors accumulate."""
        labels = batch["labels"].reshape(-1).long()
        logits = self.model(batch["images"])
        self.error.update((logits.argmax(-1) != labels).float())
        return F.cross_entropy(logits, labels), labels.numel()

    def val_metrics_compute(self, epoch: int) -> dict[str, torch.Tensor]:
        """The validation error rate since the last reset, then reset."""
        values = {"val/error": self.error.compute()}
        self.val_metrics_reset()
        return values

    def val_metrics_reset(self) -> None:
        """Forget the validation batches seen."""
        self.error.reset()

    def predict(self, batch: dict) -> dict[str, torch.Tensor]:
        """The class logits of a batch's images."""
        return {"logits": self.model(batch["images"])}


def build(task, model_cfg: DictConfig, dataset, image_size: int) -> TorchBrightness:
    """The torch side of task=brightness with the network `model_cfg` describes."""
    return TorchBrightness(instantiate_network(network_spec(model_cfg, "torch"), num_classes=dataset.num_classes))
