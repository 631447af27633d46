"""The exponential moving average of the weights (optim.ema_decay), defined once; both backends keep exactly this
(tests/test_ema.py checks each against `weight_average`).

- **When**: after every optimizer step t (1-based, counting optimizer steps: with gradient accumulation, one step per
  accumulation of batches), never after a batch that only accumulated gradients.
- **What**: ema_1 = w_1 (the weights after the first step, not the weights before it), then
  ema_t = decay * ema_{t-1} + (1 - decay) * w_t. This is Keras' own optimizer EMA (`use_ema=True,
  ema_momentum=decay`, which starts from the first step's weights); timm's ModelEmaV3 starts from the weights
  before training and warms its decay up, which is another average.
- **Over which weights**: the trainable ones. A network's non-trainable state (BatchNorm's running statistics) is
  the live model's, also where the average is used.
- **Where it is used**, when on: validation scores the average; the best and last checkpoints give hydrali eval,
  predict, export and model.weights the average; a resumed run trains on from the live weights and continues the same
  average (its state is kept in every checkpoint).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def weight_average(steps: Sequence[Sequence[np.ndarray]], decay: float) -> list[np.ndarray]:
    """The average after the last of `steps` (each the list of trainable weights after one optimizer step, in
    order), by the formula above."""
    if not steps:
        raise ValueError("the average is defined after the first optimizer step: pass at least one")
    average = [np.asarray(weight, dtype=np.float64) for weight in steps[0]]
    for weights in steps[1:]:
        average = [
            decay * kept + (1.0 - decay) * np.asarray(new, dtype=np.float64) for kept, new in zip(average, weights)
        ]
    return average
