"""Lightning's DDP strategy with the DistributedDataParallel wrapper built on the stream the training steps run on.

Lightning's DDPStrategy builds the wrapper inside `torch.cuda.stream(torch.cuda.Stream())`, a side stream of its own.
DistributedDataParallel's constructor makes each parameter's gradient-accumulation node (AccumulateGrad) to hook its
reducer on it, and the node keeps the stream it was made on: every backward of the run then produced its gradients on
the current stream and accumulated them on the side stream, which torch synchronizes at each step and announces at
the first backward ("The AccumulateGrad node's stream does not match the stream of the node that produced the incoming
gradient"). Built on the current stream, as DDP's own examples do, both are the same stream (2 H200s: the same
weights as a run with every launch synchronous, 1.02x a side stream's speed; BENCHMARKS.md). Not yet run on GPUs:
`backend.compile_mode=reduce-overhead` (CUDA graphs, for which NVIDIA advises DDP built on a side stream) on 2 GPUs.
"""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override


class SameStreamDDPStrategy(DDPStrategy):
    """DDPStrategy whose DistributedDataParallel is built on the current CUDA stream (see the module's docstring)."""

    @override
    def _setup_model(self, model) -> DistributedDataParallel:
        """The model wrapped by DistributedDataParallel with Lightning's DDP arguments, on the current stream."""
        return DistributedDataParallel(module=model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs)
