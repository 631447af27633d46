"""The SSD multibox loss in PyTorch: smooth L1 on the positive anchors' box offsets plus a
classification term, either cross-entropy with hard-negative mining or a softmax focal loss.

The Keras loss (keras_loss.py) computes the same per-image values; see the loss section of the
detection spec: L_i = (loc_i + conf_i) / max(num_pos_i, 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hydrali.tasks.detection.layout import BACKGROUND, BOX_VALUES, LABEL_COLUMN, TARGET_COLUMNS, logits_per_anchor
from hydrali.tasks.detection.spec import CLASS_LOSS_SETTINGS, DetectionLoss, DetectionTaskConfig

SMOOTH_L1_BETA = 1.0  # 0.5 d^2 below |d| = 1, |d| - 0.5 above
NOT_A_NEGATIVE = -1.0  # the mining key of positive anchors: below any cross-entropy (>= 0)
MIN_LOGITS = logits_per_anchor(1)  # raw needs the logits of background and at least one class
DEFAULTS = DetectionTaskConfig  # the loss's settings default to the schema's defaults (task.*)


def _check_shapes(raw: torch.Tensor, targets: torch.Tensor) -> None:
    """ValueError unless raw is [B, N, 4 + C] (C >= 2) and targets [B, N, 5]."""
    if (
        raw.dim() != 3
        or targets.dim() != 3
        or raw.shape[:2] != targets.shape[:2]
        or raw.shape[-1] < BOX_VALUES + MIN_LOGITS
        or targets.shape[-1] != TARGET_COLUMNS
    ):
        raise ValueError(
            f"multibox loss: expected raw [B, N, {BOX_VALUES} + C] (C >= {MIN_LOGITS}) and targets "
            f"[B, N, {TARGET_COLUMNS}], got {tuple(raw.shape)} and {tuple(targets.shape)}"
        )


def _box_loss(loc: torch.Tensor, target_loc: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[B] sum of smooth L1 over the positive anchors and the 4 offsets."""
    per_anchor = F.smooth_l1_loss(loc, target_loc, reduction="none", beta=SMOOTH_L1_BETA).sum(dim=-1)
    return torch.where(pos, per_anchor, torch.zeros_like(per_anchor)).sum(dim=1)


def _hard_negative_conf(ce: torch.Tensor, pos: torch.Tensor, neg_pos_ratio: float) -> torch.Tensor:
    """[B] cross-entropy summed over the positives and the k_i negatives of largest cross-entropy,
    k_i = min(floor(neg_pos_ratio * num_pos_i), N - num_pos_i)."""
    num_anchors = ce.shape[1]
    num_pos = pos.sum(dim=1)
    # in float32, as the Keras loss computes it (float64 is not available on every Keras backend): for some
    # non-integer ratios the product rounds differently in float64, e.g. 2.1 * 30 -> 63, but 62 in float32
    ratio = torch.tensor(neg_pos_ratio, dtype=torch.float32, device=ce.device)
    wanted = torch.floor(num_pos.to(torch.float32) * ratio).to(torch.long)
    k = torch.minimum(wanted, num_anchors - num_pos)  # [B]
    key = torch.where(pos, torch.full_like(ce, NOT_A_NEGATIVE), ce).detach()
    order = torch.argsort(key, dim=1, descending=True)  # negatives first
    ranked_ce = ce.gather(1, order)
    chosen = torch.arange(num_anchors, device=ce.device).unsqueeze(0) < k.unsqueeze(1)
    mined = torch.where(chosen, ranked_ce, torch.zeros_like(ranked_ce)).sum(dim=1)
    positive = torch.where(pos, ce, torch.zeros_like(ce)).sum(dim=1)
    return positive + mined


def _focal_conf(log_p: torch.Tensor, pos: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """[B] softmax focal loss summed over all anchors: -alpha_t (1 - p_t)^gamma log p_t, alpha_t = alpha
    for positives and 1 - alpha for background anchors."""
    alpha_t = torch.where(pos, torch.full_like(log_p, alpha), torch.full_like(log_p, 1.0 - alpha))
    p_t = torch.exp(log_p)
    return (-alpha_t * (1.0 - p_t) ** gamma * log_p).sum(dim=1)


# task.loss -> its class term [B] of (log p of each anchor's label [B, N], positive [B, N], the loss's settings)
CLASS_LOSSES = {
    DetectionLoss.hard_negatives: lambda log_p, pos, settings: _hard_negative_conf(
        -log_p, pos, settings["neg_pos_ratio"]
    ),
    DetectionLoss.focal: lambda log_p, pos, settings: _focal_conf(
        log_p, pos, settings["focal_alpha"], settings["focal_gamma"]
    ),
}


def multibox_loss(
    raw: torch.Tensor,
    targets: torch.Tensor,
    *,
    kind: str = DEFAULTS.loss,
    neg_pos_ratio: float = DEFAULTS.neg_pos_ratio,
    focal_alpha: float = DEFAULTS.focal_alpha,
    focal_gamma: float = DEFAULTS.focal_gamma,
) -> torch.Tensor:
    """Per-image SSD losses [B] (float32) of a head's raw output [B, N, 4 + C] (box offsets, then class
    logits with index 0 = background) against targets [B, N, 5] (encoded offsets, then the label as a
    float: 0 background, 1..K): (loc_i + conf_i) / max(num_pos_i, 1).

    kind "hard_negatives": conf_i = cross-entropy over the positives plus the k_i hardest negatives,
    k_i = min(floor(neg_pos_ratio * num_pos_i), N - num_pos_i). kind "focal": softmax focal loss over
    all anchors (focal_alpha for positives, 1 - focal_alpha for background; focal_gamma).
    """
    class_loss = CLASS_LOSSES[DetectionLoss.of(kind, "task.loss")]
    _check_shapes(raw, targets)
    raw, targets = raw.float(), targets.float()
    labels = torch.round(targets[..., LABEL_COLUMN]).to(torch.long)
    pos = labels > BACKGROUND
    loc = _box_loss(raw[..., :BOX_VALUES], targets[..., :BOX_VALUES], pos)
    log_p = F.log_softmax(raw[..., BOX_VALUES:], dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    conf = class_loss(
        log_p, pos, {"neg_pos_ratio": neg_pos_ratio, "focal_alpha": focal_alpha, "focal_gamma": focal_gamma}
    )
    return (loc + conf) / pos.sum(dim=1).clamp(min=1).to(loc.dtype)


class MultiboxLoss(nn.Module):
    """The SSD multibox loss as a module: forward(raw, targets) -> the batch mean of `multibox_loss`;
    per_image(raw, targets) -> the per-image losses [B]."""

    def __init__(
        self,
        kind: str = DEFAULTS.loss,
        neg_pos_ratio: float = DEFAULTS.neg_pos_ratio,
        focal_alpha: float = DEFAULTS.focal_alpha,
        focal_gamma: float = DEFAULTS.focal_gamma,
    ):
        super().__init__()
        self.kind = DetectionLoss.of(kind, "task.loss").value
        self.neg_pos_ratio = float(neg_pos_ratio)
        self.focal_alpha = float(focal_alpha)
        self.focal_gamma = float(focal_gamma)

    def class_settings(self) -> dict:
        """The class loss's settings (neg_pos_ratio, focal_alpha, focal_gamma), as the constructor took them."""
        return {name: getattr(self, name) for name in CLASS_LOSS_SETTINGS}

    def per_image(self, raw: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """[B] per-image losses (see multibox_loss)."""
        return multibox_loss(raw, targets, kind=self.kind, **self.class_settings())

    def forward(self, raw: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean over the batch of the per-image losses (a scalar)."""
        return self.per_image(raw, targets).mean()

    def extra_repr(self) -> str:
        """The loss's settings, for print(module)."""
        return (
            f"kind={self.kind!r}, neg_pos_ratio={self.neg_pos_ratio}, focal_alpha={self.focal_alpha}, "
            f"focal_gamma={self.focal_gamma}"
        )
