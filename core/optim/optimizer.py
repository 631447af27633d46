"""Optimizer semantics, defined once; both backends implement exactly these (tested step for step).

- **SGD** is torch's: weight decay is *coupled* (L2: added to the gradient before momentum), then
  buf = momentum * buf + g, step = g + momentum * buf with Nesterov (else buf), w -= lr * step.
  Keras' own SGD differs (decoupled decay, lr folded into its momentum buffer), so the Keras backend
  brings an optimizer with torch's update rule.
- **AdamW** is decoupled on both: w -= lr * weight_decay * w, then Adam with bias correction and
  epsilon ADAM_EPSILON.
- **Which parameters decay** (optim.weight_decay_on): `kernels`, those with two or more dimensions (convolution
  and dense kernels), never biases or normalization scales and shifts; `all`, every trainable parameter (David
  Page's CIFAR-10 recipe decays them all).
- **Backbone lr** (optim.backbone_lr_mult = k, classification): the backbone's parameters (all but the head: on
  torch the network's last child module with parameters, on Keras its last layer with weights) step with lr x k,
  the head's with lr; weight decay as above.
- **Label smoothing** (task.label_smoothing = e): cross-entropy against (1 - e) * one-hot + e / classes.
- **Class weights** (task.class_weights, hydrali.core.optim.class_weights): each sample's loss times its class's
  weight, averaged over the batch's samples (not over the weights: torch's `weight=` mean is not it), in training
  and in validation's val/loss.
- **Learning rate**: the plan's effective lr times hydrali.core.optim.schedule.lr_factor(step), the same at every step.
- **Precision** (backend.precision, hydrali.core.config.schema.Precision): 32-true, bf16-mixed or 16-mixed on
  both backends (Lightning's names; Keras uses the mixed_bfloat16 / mixed_float16 dtype policies, 16-mixed
  with loss scaling).
"""

from __future__ import annotations

from typing import Sequence

from hydrali.core.config.schema import WeightDecayOn

ADAM_EPSILON = 1e-8


def decays(shape: Sequence[int], on: str = WeightDecayOn.kernels.value) -> bool:
    """Whether a parameter of this shape takes weight decay when it applies `on` the kernels (they do; biases and
    norm parameters do not) or on all parameters (a WeightDecayOn value)."""
    return WeightDecayOn.of(on, "optim.weight_decay_on") is WeightDecayOn.all or len(tuple(shape)) >= 2
