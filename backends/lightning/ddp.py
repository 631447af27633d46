"""Lightning's DDP strategy with the DistributedDataParallel wrapper built on the stream the training steps run on.

Lightning's DDPStrategy builds the wrapper inside `torch.cuda.stream(torch.cuda.Stream())`, a side stream of its own.
DistributedDataParallel's constructor makes each parameter's gradient-accumulation node (AccumulateGrad) to hook its
reducer on it, and the node keeps the stream it was made on: every backward of the run then produced its gradients on
the current stream and accumulated them on the side stream, which torch synchronizes at each step and announces at
the first backward ("The AccumulateGrad node's stream does not match the stream of the node that produced the incoming
gradient"). Built on the current stream, as DDP's own examples do, both are the same stream.
"""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel


class SameStreamDDPStrategy(DDPStrategy):
    """DDPStrategy whose DistributedDataParallel is built on the current CUDA stream (see the module's docstring)."""

    def _setup_model(self, model) -> DistributedDataParallel:
        """The model wrapped by DistributedDataParallel with Lightning's DDP arguments, on the current stream."""
        return DistributedDataParallel(module=model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs)
