"""Mixup and cutmix inside DALI, for training batches: what timm's Mixup does in its per-sample mode (`elem`), so
that both backends receive the same mixed batches by construction.

Each sample i is mixed with its partner, sample B-1-i of the same batch (the batch reversed, timm's `x.flip(0)`;
training batches are always whole, core/run/epoch.py). With probability `mix_probability` a sample is mixed; then
with probability `switch_probability` (when both are on) by cutmix, else by mixup:
- mixup: lam ~ Beta(mixup_alpha, mixup_alpha); image = lam * image + (1 - lam) * partner;
- cutmix: lam ~ Beta(cutmix_alpha, cutmix_alpha); a square of side floor(side * sqrt(1 - lam)) at a random place,
  clipped to the image, is pasted from the partner, and lam becomes 1 - the pasted share of the image (timm's
  `correct_lam`).
Labels become soft targets over the classes: lam * onehot(label) + (1 - lam) * onehot(partner's label). The
task's label smoothing is applied to them by the loss, which on a mixture of one-hots equals timm's smoothing of
each one-hot before mixing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
from nvidia.dali import Pipeline

from hydrali.core.errors import HydraliError
from hydrali.tasks.classification.boxes import erase, random_box

SOFT_LABEL_DTYPE = "float"  # the soft labels' dtype in output_specs' names (pipeline.dtype's: float is float32)


@dataclass(frozen=True)
class Mixing:
    """The mixing options of a recipe (pipeline.options): alphas of the Beta distributions (0 turns that kind off),
    the share of samples mixed, and the chance of cutmix rather than mixup when both are on."""

    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_probability: float = 1.0
    switch_probability: float = 0.5

    def __post_init__(self):
        for name in ("mixup_alpha", "cutmix_alpha"):
            if getattr(self, name) < 0:
                raise HydraliError(f"pipeline.options.{name}={getattr(self, name)}: pass a value >= 0 (0 turns it off)")
        for name in ("mix_probability", "switch_probability"):
            if not 0 <= getattr(self, name) <= 1:
                raise HydraliError(f"pipeline.options.{name}={getattr(self, name)}: pass a value in [0, 1]")

    @property
    def on(self) -> bool:
        """Whether any sample may be mixed (and the labels are soft targets)."""
        return (self.mixup_alpha > 0 or self.cutmix_alpha > 0) and self.mix_probability > 0


def mixes(options: Mapping[str, Any]) -> bool:
    """Whether a recipe's options (pipeline.options) turn mixing on: its training labels are then soft targets."""
    names = [field.name for field in fields(Mixing)]
    return Mixing(**{name: options[name] for name in names if name in options}).on


def _flag(probability: float):
    """1.0 with `probability`, else 0.0, per sample (float32)."""
    return fn.cast(fn.random.coin_flip(probability=probability), dtype=types.FLOAT)


def _ones_mask(side: int, layout: str, device: str):
    """A side x side single-channel image of ones per sample, in `layout` (HWC or CHW)."""
    shape = [side, side, 1] if layout == "HWC" else [1, side, side]
    return fn.constant(fdata=1.0, shape=shape, layout=layout, dtype=types.FLOAT, device=device)


def _cutmix(alpha: float, side: int, layout: str, device: str):
    """(lam, mask): a cutmix box drawn with Beta(alpha, alpha) per sample, lam corrected to the area pasted, and a
    single-channel mask that is 0 on the box (the partner's pixels) and 1 elsewhere."""
    drawn = fn.random.beta(alpha=alpha, beta=alpha)
    length = fn.cast(dmath.floor(side * dmath.sqrt(1.0 - drawn)), dtype=types.INT32)
    box = random_box(side, length)
    lam = 1.0 - fn.cast(box.area, dtype=types.FLOAT) / float(side * side)
    return lam, erase(_ones_mask(side, layout, device), box)


def _on(device: str, node):
    """`node` (on the CPU) where the images are."""
    return node.gpu() if device == "gpu" else node


def _lam_and_weight(mixing: Mixing, side: int, layout: str, device: str):
    """(lam per sample on the CPU, weight of each sample's own pixels on `device`: a per-sample scalar for mixup,
    a per-pixel 0/1 mask for cutmix, 1 where the sample is not mixed)."""
    if mixing.cutmix_alpha > 0:
        cut_lam, mask = _cutmix(mixing.cutmix_alpha, side, layout, device)
    if mixing.mixup_alpha > 0:
        mix_lam = fn.random.beta(alpha=mixing.mixup_alpha, beta=mixing.mixup_alpha)
    if mixing.cutmix_alpha > 0 and mixing.mixup_alpha > 0:
        use_cutmix = _flag(mixing.switch_probability)
        lam = use_cutmix * cut_lam + (1.0 - use_cutmix) * mix_lam
        weight = _on(device, use_cutmix) * mask + _on(device, (1.0 - use_cutmix) * mix_lam)
    elif mixing.cutmix_alpha > 0:
        lam, weight = cut_lam, mask
    else:
        lam, weight = mix_lam, _on(device, mix_lam)
    mixed = _flag(mixing.mix_probability)
    return mixed * lam + (1.0 - mixed), _on(device, mixed) * weight + _on(device, 1.0 - mixed)


def soft_labels(labels, partner_labels, lam, num_classes: int):
    """lam * onehot(labels) + (1 - lam) * onehot(partner_labels): (num_classes,) float32 per sample, on the CPU."""
    own = fn.one_hot(labels, num_classes=num_classes, dtype=types.FLOAT)
    partner = fn.one_hot(partner_labels, num_classes=num_classes, dtype=types.FLOAT)
    return lam * own + (1.0 - lam) * partner


def mix_batch(images, labels, mixing: Mixing, *, num_classes: int, side: int, layout: str, device: str):
    """(mixed images, soft labels) of a training batch: `images` (side x side, `layout`, on `device`, float) each
    mixed with its partner in the reversed batch as `mixing` says; `labels` (int, on the CPU) become soft targets
    (num_classes,) float32 on `device`."""
    batch = Pipeline.current().max_batch_size
    reversed_batch = list(range(batch - 1, -1, -1))
    partner_images = fn.permute_batch(images, indices=reversed_batch)
    partner_labels = fn.permute_batch(labels, indices=reversed_batch)
    lam, weight = _lam_and_weight(mixing, side, layout, device)
    mixed = weight * images + (1.0 - weight) * partner_images
    return mixed, _on(device, soft_labels(labels, partner_labels, lam, num_classes))
