"""The detection task on torch: the SSD network, its multibox loss and its validation, used by the Lightning backend."""

from __future__ import annotations

import contextlib

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from hydrali.core.contracts.task import TorchSideDefaults
from hydrali.core.distributed.topology import is_first_process
from hydrali.tasks.base import network_spec
from hydrali.tasks.detection.layout import BOX_VALUES
from hydrali.tasks.detection.torch_decode import decode_boxes, decode_detections
from hydrali.tasks.detection.torch_loss import multibox_loss


@contextlib.contextmanager
def _one_thread_on_cpu(device: torch.device):
    """Decoding's many small ops run several times faster on one thread on a busy CPU (measured on 2 cores)."""
    if device.type != "cpu":
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class TorchDetection(nn.Module, TorchSideDefaults):
    """The torch side of a detection task (hydrali.core.contracts.task.TorchSide): holds the detector, its multibox
    loss and one validation's detections; it does not start from another run nor tell a backbone from a head."""

    def __init__(self, model: nn.Module, anchors, task, validation):
        super().__init__()
        self.model = model
        self.register_buffer("anchors", torch.as_tensor(anchors, dtype=torch.float32), persistent=False)
        self.loss_args = task.loss_args()
        self.detection_args = task.detection_args()
        self.validation = validation

    def _loss(self, raw: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return multibox_loss(raw, targets, **self.loss_args).mean()

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, int]:
        """The loss of one training batch and the number of images in it."""
        images = batch["images"]
        return self._loss(self.model(images), batch["targets"]), images.shape[0]

    def validation_step(self, batch: dict) -> tuple[torch.Tensor, int]:
        """Decode one batch into detections for the validation; return its loss and size."""
        images = batch["images"]
        raw = self.model(images)
        with _one_thread_on_cpu(raw.device):
            found = decode_detections(raw[..., :BOX_VALUES], raw[..., BOX_VALUES:], self.anchors, **self.detection_args)
        self.validation.add_batch(
            batch["image_ids"].reshape(-1).tolist(),
            [boxes.cpu().numpy() for boxes, _, _ in found],
            [scores.cpu().numpy() for _, scores, _ in found],
            [labels.cpu().numpy() for _, _, labels in found],
        )
        return self._loss(raw, batch["targets"]), images.shape[0]

    prediction_names = ("boxes", "scores", "labels", "counts")  # what `predict` returns (hydrali eval, predict)
    serving_names = ("boxes", "scores")  # what `serving` returns: what hydrali export writes

    def serving(self, batch: dict) -> dict[str, torch.Tensor]:
        """What an exported detector computes (hydrali export), the per-class NMS left to the serving stack: every
        anchor's box, decoded (ltrb in [0, 1] of the resized image) [B, N, 4], and its class probabilities [B, N,
        1 + K] (index 0: background)."""
        raw = self.model(batch["images"])
        boxes = decode_boxes(raw[..., :BOX_VALUES], self.anchors).clamp(0.0, 1.0)
        return {"boxes": boxes, "scores": torch.softmax(raw[..., BOX_VALUES:].float(), dim=-1)}

    def predict(self, batch: dict) -> dict[str, torch.Tensor]:
        """Each image's detections, padded to max_detections rows: boxes [B, M, 4] ltrb in [0, 1], scores [B, M],
        labels [B, M] (1..K, -1 in padding), and counts [B] of real rows (scored by tasks/detection/scoring.py)."""
        raw = self.model(batch["images"])
        with _one_thread_on_cpu(raw.device):
            found = decode_detections(raw[..., :BOX_VALUES], raw[..., BOX_VALUES:], self.anchors, **self.detection_args)
        rows = self.detection_args["max_detections"]
        boxes = raw.new_zeros((len(found), rows, BOX_VALUES))
        scores = raw.new_zeros((len(found), rows))
        labels = torch.full((len(found), rows), -1, dtype=torch.int64, device=raw.device)
        for i, (image_boxes, image_scores, image_labels) in enumerate(found):
            boxes[i, : len(image_boxes)] = image_boxes
            scores[i, : len(image_scores)] = image_scores
            labels[i, : len(image_labels)] = image_labels
        counts = torch.tensor([len(image_scores) for _, image_scores, _ in found], device=raw.device)
        return {"boxes": boxes, "scores": scores, "labels": labels, "counts": counts}

    def val_metrics_compute(self, epoch: int) -> dict[str, float]:
        """COCO mAP of the epoch's detections from every process (val/map, val/map50); then reset."""
        self.validation.gather_across_processes()  # through the collective the backend installed
        return self.validation.finish(epoch, draw=is_first_process())

    def val_metrics_reset(self) -> None:
        """Forget the detections collected (e.g. after Lightning's sanity check)."""
        self.validation.evaluator.reset()


def build(task, model_cfg: DictConfig, dataset, image_size: int) -> TorchDetection:
    """The torch side of `task`: the network of `model_cfg` (any _target_ returning an nn.Module that maps
    [B, 3, S, S] images to [B, N, 4 + 1 + K] raw outputs) for `dataset`'s categories."""
    model = instantiate(
        network_spec(model_cfg, "torch"),
        num_classes=dataset.num_classes,
        image_size=image_size,
        anchors=OmegaConf.to_container(model_cfg.anchors, resolve=True),
    )
    if not isinstance(model, nn.Module):
        raise TypeError(f"model._target_={model_cfg._target_} returned {type(model).__name__}, not an nn.Module")
    return TorchDetection(model, task.anchors(model_cfg, image_size), task, task.validation(dataset))
