"""The exponential moving average of a torch network's trainable weights, as hydrali.core.optim.ema defines it: kept
beside the network, updated after every optimizer step, swapped in for validation, and written into checkpoints so
that their weights are the average (what hydrali eval, predict and export load) while a resume trains on from the
live weights and continues the same average."""

from __future__ import annotations

import torch

LIVE_WEIGHTS_KEY = "hydrali_live_weights"  # a checkpoint's {"weights": the trained (not averaged) trainable weights
#   by state_dict key, "steps": optimizer steps averaged}; its state_dict holds the average in their place


class WeightAverage:
    """The average of `module`'s trainable parameters (hydrali.core.optim.ema) with `decay`, named by their keys in
    `module`'s state_dict."""

    def __init__(self, module: torch.nn.Module, decay: float):
        self.module = module
        self.names = [name for name, p in module.named_parameters() if p.requires_grad]
        self.decay = float(decay)
        self.steps = 0  # optimizer steps averaged
        self._kept: list[torch.Tensor] = []  # the average; while swapped in, the live weights
        self.swapped = False

    @property
    def parameters(self) -> list[torch.Tensor]:
        """The averaged parameters as the module holds them now (a strategy may have moved or replaced them)."""
        by_name = dict(self.module.named_parameters())
        return [by_name[name] for name in self.names]

    def _kept_beside_parameters(self) -> None:
        """Move the kept weights to their parameters' device and dtype (a checkpoint is loaded before the strategy
        moves the network to its GPU)."""
        self._kept = [
            kept if kept.device == p.device and kept.dtype == p.dtype else kept.to(p.device, p.dtype)
            for kept, p in zip(self._kept, self.parameters)
        ]

    @torch.no_grad()
    def update(self) -> None:
        """Average in the weights after an optimizer step: the first step's weights, then decay x average +
        (1 - decay) x weights."""
        if self.swapped:
            raise RuntimeError("the average is swapped in: a step would train it")
        self._kept_beside_parameters()
        if self.steps == 0:
            self._kept = [p.detach().clone() for p in self.parameters]
        else:
            torch._foreach_lerp_(self._kept, [p.detach() for p in self.parameters], 1.0 - self.decay)
        self.steps += 1

    @torch.no_grad()
    def swap(self) -> None:
        """Exchange the network's weights and the kept ones (the average in, or the live weights back); nothing
        before the first step."""
        if self.steps == 0:
            return
        self._kept_beside_parameters()
        for parameter, kept in zip(self.parameters, self._kept):
            held = parameter.detach().clone()
            parameter.copy_(kept)
            kept.copy_(held)
        self.swapped = not self.swapped

    def swap_in(self) -> None:
        """Put the average into the network (for validation), if it is not there."""
        if not self.swapped:
            self.swap()

    def swap_out(self) -> None:
        """Put the live weights back into the network, if the average is there."""
        if self.swapped:
            self.swap()

    def average(self) -> list[torch.Tensor]:
        """The averaged weights, in parameter order, wherever they are."""
        return self.parameters if self.swapped else self._kept

    def live(self) -> list[torch.Tensor]:
        """The trained weights, in parameter order, wherever they are."""
        return self._kept if self.swapped else self.parameters

    def into_checkpoint(self, checkpoint: dict) -> None:
        """Make the checkpoint's state_dict hold the average in place of the trainable weights, the live weights and
        the steps averaged under LIVE_WEIGHTS_KEY (nothing before the first step)."""
        if self.steps == 0:
            return
        state = checkpoint["state_dict"]
        checkpoint[LIVE_WEIGHTS_KEY] = {
            "weights": {name: weight.detach().clone() for name, weight in zip(self.names, self.live())},
            "steps": self.steps,
        }
        for name, weight in zip(self.names, self.average()):
            state[name] = weight.detach().clone()

    @torch.no_grad()
    def from_checkpoint(self, checkpoint: dict) -> None:
        """Take the average from a checkpoint written by into_checkpoint, and put the live weights back into its
        state_dict (which the network then loads)."""
        restore_live_weights(checkpoint)
        saved = checkpoint.get(LIVE_WEIGHTS_KEY)
        if saved is None:
            return
        averaged = saved["average"]
        self._kept = [averaged[name].to(p.device, p.dtype).clone() for name, p in zip(self.names, self.parameters)]
        self.steps = int(saved["steps"])
        self.swapped = False


def restore_live_weights(checkpoint: dict) -> None:
    """Put a checkpoint's live weights (LIVE_WEIGHTS_KEY) back into its state_dict, keeping the average it held
    there under LIVE_WEIGHTS_KEY's "average": what a resume (of a run with or without the average) loads."""
    saved = checkpoint.get(LIVE_WEIGHTS_KEY)
    if saved is None or "average" in saved:
        return
    state = checkpoint["state_dict"]
    saved["average"] = {name: state[name] for name in saved["weights"]}
    state.update(saved["weights"])
