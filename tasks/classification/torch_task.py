"""The classification task on torch: model, loss and validation (scored by tasks/classification/validation.py), used
by the torch backends."""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from torch import nn
from torch.nn import functional as F

from hydrali.core.contracts.task import TorchSideDefaults
from hydrali.tasks.base import instantiate_network, network_spec
from hydrali.tasks.classification.validation import ClassificationValidation
from hydrali.tasks.torch_fine_tuning import backbone, freeze, start_from


class TorchClassification(nn.Module, TorchSideDefaults):
    """The torch side of a classification task (hydrali.core.contracts.task.TorchSide): holds the network, the
    cross-entropy loss and one validation's top-1 classes, scored by the framework-neutral validation."""

    def __init__(
        self,
        model: nn.Module,
        num_classes: int,
        label_smoothing: float = 0.0,
        class_weights: tuple | None = None,
        flip_averaging: bool = False,
    ):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.flip_averaging = flip_averaging  # task.flip_averaging: validation and predict average with the mirror
        # task.class_weights: not in the state_dict (a checkpoint holds the network, not the data's counts)
        weights = torch.tensor(class_weights, dtype=torch.float32) if class_weights else None
        self.register_buffer("class_weights", weights, persistent=False)
        self.num_classes = num_classes  # the classes the network scores
        self.validation = ClassificationValidation()
        # each validation batch's top-1 classes and labels (2, B), left on the device until the validation ends: no
        # wait on the device per batch, one copy of 2 integers a sample per validation
        self._top_one: list[torch.Tensor] = []
        self.frozen: list[nn.Module] = []  # parts of the network that do not train (model.freeze)

    def backbone_parameters(self) -> list[nn.Parameter]:
        """The parameters of the network's backbone (all but its head), for optim.backbone_lr_mult."""
        return [p for module in backbone(self.model) for p in module.parameters()]

    def initialise_from(self, state: dict) -> bool:
        """Start the network from another run's state_dict of this side (keys `model.*`); a new head when the number
        of classes differs. Return whether the head was loaded too."""
        prefix = "model."
        return start_from(self.model, {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})

    def train(self, mode: bool = True) -> TorchClassification:
        """Training or evaluation mode, but the frozen parts always evaluate (their BatchNorm statistics stay)."""
        super().train(mode)
        if self.frozen:  # found again: a wrapper (e.g. sync_batchnorm) may have replaced modules since the build
            self.frozen = backbone(self.model)
            for module in self.frozen:
                module.eval()
        return self

    @staticmethod
    def unpack(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, labels) from a batch of the recipe's outputs: labels as int64 class indices (B,), or as the
        soft targets (B, K) float of a training recipe that mixes (mixup, cutmix)."""
        labels = batch["labels"]
        if labels.is_floating_point():
            return batch["images"], labels
        return batch["images"], labels.reshape(-1).long()

    def loss_fn(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy with label smoothing against class indices or soft targets, each sample's loss times its
        class's weight (task.class_weights; a soft target's classes' weights, weighted by it), averaged over the
        samples (hydrali.core.optim.optimizer)."""
        target = labels.to(logits.dtype) if labels.is_floating_point() else labels
        per_sample = F.cross_entropy(logits, target, label_smoothing=self.label_smoothing, reduction="none")
        if self.class_weights is not None:
            per_sample = per_sample * self._sample_weights(labels)
        return per_sample.mean()

    def _sample_weights(self, labels: torch.Tensor) -> torch.Tensor:
        """Each sample's class weight: its class's, or a soft target's mean of its classes' weights."""
        if labels.is_floating_point():
            return labels.float() @ self.class_weights
        return self.class_weights[labels]

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, int]:
        """The loss of one training batch and the number of samples in it."""
        images, labels = self.unpack(batch)
        return self.loss_fn(self.model(images), labels), labels.shape[0]

    def validation_step(self, batch: dict) -> tuple[torch.Tensor, int]:
        """Keep one batch's top-1 classes and labels for the validation (every sample real: a torch backend's
        validation batches hold no padding); return its loss and size."""
        images, labels = self.unpack(batch)
        logits = self.evaluation_logits(images)
        self._top_one.append(torch.stack([logits.argmax(dim=-1), labels]))
        return self.loss_fn(logits, labels), labels.numel()

    def evaluation_logits(self, images: torch.Tensor) -> torch.Tensor:
        """The class logits that validation and predict score: the network's, or with task.flip_averaging the log
        of the mean of its class probabilities on the images (NCHW) and on them mirrored left-right."""
        logits = self.model(images)
        if not self.flip_averaging:
            return logits
        return mean_of_probabilities(logits, self.model(torch.flip(images, dims=(-1,))))

    prediction_names = ("logits",)  # what `predict` and `serving` return, in this order (hydrali eval, predict)

    def predict(self, batch: dict) -> dict[str, torch.Tensor]:
        """The class logits for a batch's images, flip-averaged with task.flip_averaging (scored by
        tasks/classification/scoring.py)."""
        return {"logits": self.evaluation_logits(batch["images"])}

    def serving(self, batch: dict) -> dict[str, torch.Tensor]:
        """What hydrali export writes: the network's own class logits (never flip-averaged)."""
        return {"logits": self.model(batch["images"])}

    def val_metrics_compute(self, epoch: int) -> dict[str, float]:
        """The top-1 accuracy of the epoch over every process's shard (val/acc), then reset for the next."""
        if self._top_one:  # this process's batches, to the host at once
            predicted, labels = torch.cat(self._top_one, dim=1).cpu().numpy()
            self.validation.add_batch(predicted, labels)
            self._top_one.clear()
        self.validation.gather_across_processes()  # through the collective the backend installed
        return self.validation.finish(epoch)

    def val_metrics_reset(self) -> None:
        """Forget the batches seen (e.g. after Lightning's sanity check)."""
        self._top_one.clear()
        self.validation.reset()


def mean_of_probabilities(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """log((softmax(first) + softmax(second)) / 2) in float32: logits whose softmax is the mean of the two."""
    log_probabilities = torch.stack([F.log_softmax(first.float(), -1), F.log_softmax(second.float(), -1)])
    return torch.logsumexp(log_probabilities, dim=0) - math.log(2.0)


def build(task, model_cfg: DictConfig, dataset, image_size: int) -> TorchClassification:
    """The torch side of `task` with the network described by `model_cfg` (any _target_ returning an nn.Module)
    for `dataset`'s classes."""
    num_classes = dataset.num_classes
    model = instantiate_network(network_spec(model_cfg, "torch"), num_classes=num_classes)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model._target_={model_cfg._target_} returned {type(model).__name__}, not an nn.Module")
    side = TorchClassification(
        model, num_classes, task.label_smoothing, getattr(dataset, "class_weights", None), task.flip_averaging
    )
    side.frozen = freeze(model, model_cfg.get("freeze"))
    return side
