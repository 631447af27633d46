"""The benchmark's torch side: the Lightning step timer, and the same network trained by a plain PyTorch loop,
on batches already on the device (the upper bound) or fed by the task's DALI pipeline.

Both loops train what the Lightning backend trains, built by the backend's own builders (backends/torch/,
backends/lightning/module.py): the task's torch side in a HydraliModule (its memory format), compiled as the backend
compiles it with `backend.compile=true` (the warm-up steps take the compile), the module's optimizer and per-step lr
schedule, Lightning's precision plugin of `backend.precision`, and the backend's DALI loader of the shard. Only the
loop around them is plain: no Trainer, no callbacks, no logging.
"""

from __future__ import annotations

import lightning as L
import torch
from omegaconf import DictConfig

from hydrali.backends.torch.device import synchronize
from hydrali.bench.timing import HostStamp, StepWindow, time_steps


def probe_contract(cfg: DictConfig, plan):
    """The run contract the torch loops train by: `auto` settings decided for the device the probe trains on (the
    GPU of the plan's first shard when DALI runs on a GPU, else the CPU), as a run there decides them."""
    from hydrali.backends.torch.device import training_device_of
    from hydrali.core.run.contract import contract_on_device

    on_gpu = plan.device == "gpu"
    device = torch.device("cuda", plan.shards[0].device_id or 0) if on_gpu else torch.device("cpu")
    return contract_on_device(cfg, plan, training_device_of(device))


class CudaStamp:
    """A point on the GPU's own timeline: a CUDA event recorded on the current stream (no synchronization)."""

    def __init__(self):
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record()

    def seconds_since(self, earlier: "CudaStamp") -> float:
        """Seconds from `earlier` to this point (both events completed: read after a synchronize)."""
        return earlier.event.elapsed_time(self.event) / 1e3


def step_stamp(device: torch.device):
    """How the torch loops mark each step's end on `device`: CUDA events on a GPU, the host's clock on the CPU."""
    return CudaStamp if device.type == "cuda" else HostStamp


class LightningStepTimer(L.Callback):
    """Times `steps` training steps after `warmup` ones (CUDA synchronized at both ends, each step's end marked),
    then stops the fit; the Timing lands in hydrali.bench.timing.STEP_WINDOWS[key]."""

    def __init__(self, key: str, warmup: int, steps: int, images_per_step: int):
        self.window = StepWindow(key, warmup, steps, images_per_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        device = pl_module.device
        if self.window.step_end(lambda: synchronize(device), step_stamp(device)):
            trainer.should_stop = True


class TorchLoop:
    """The task's network trained by a plain loop: `feed` = "tensors" (the shard's first batch, kept on the device
    and fed again at every step: the upper bound) or "dali" (the backend's DALI loader of the shard). It runs where
    the plan puts DALI: on the GPU with "gpu", else on the CPU. The network, optimizer and step are the Lightning
    backend's probe (backends/lightning/probe.py), which pipeline.autotune trains too."""

    def __init__(self, task, cfg: DictConfig, dataset, plan, feed: str, warmup: int, steps: int):
        self.task, self.cfg, self.dataset, self.plan, self.feed = task, cfg, dataset, plan, feed
        self.warmup, self.steps = warmup, steps
        self._state = None

    def _build(self):
        from hydrali.backends.lightning.probe import LightningProbe

        contract = probe_contract(self.cfg, self.plan)
        probe = LightningProbe(contract=contract, task=self.task, dataset=self.dataset)
        return probe, self._batches(probe.device, contract)

    def _batches(self, device: torch.device, contract):
        from hydrali.backends.torch.loaders import dali_loader

        loader = dali_loader(task=self.task, contract=contract, dataset=self.dataset, is_training=True)
        if self.feed == "tensors":
            first = {name: value.to(device).clone() for name, value in next(iter(loader)).items()}
            del loader  # the pipeline is not read again
            while True:
                yield first
        while True:
            yield from loader

    def once(self):
        """The Timing of `steps` optimizer steps after `warmup` (CUDA synchronized on the GPU, each step's end
        marked)."""
        if self._state is None:
            self._state = self._build()
        probe, batches = self._state
        return time_steps(
            lambda: probe.train_step(next(batches)),
            warmup=self.warmup,
            steps=self.steps,
            images_per_step=self.plan.per_replica_batch,
            sync=probe.wait,
            stamp=step_stamp(probe.device),
        )

    def close(self) -> None:
        """Free the network, its optimizer and the pipeline."""
        if self._state is not None:
            self._state[0].close()
        self._state = None
