"""The benchmark's torch side: the Lightning step timer, and the same network trained by a plain PyTorch loop,
on batches already on the device (the upper bound) or fed by the task's DALI pipeline.

Both loops train what the Lightning backend trains: the task's torch side (`task.torch_target`, its
`training_loss`), hydrali's optimizer (backends/lightning/module.py make_optimizer) at the plan's lr, the
precision of `backend.precision` (autocast), `backend.channels_last` and, with `backend.compile=true`,
the network compiled as the Lightning backend compiles it (the compiled bound; warm-up steps take the compile).
"""
from __future__ import annotations

import contextlib

import lightning as L
import torch
from hydra.utils import get_method
from omegaconf import DictConfig

from hydrali.core.bench.timing import HostStamp, StepWindow, time_steps

AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    then stops the fit; the Timing lands in hydrali.core.bench.timing.STEP_WINDOWS[key]."""

    def __init__(self, key: str, warmup: int, steps: int, images_per_step: int):
        self.window = StepWindow(key, warmup, steps, images_per_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        device = pl_module.device
        if self.window.step_end(lambda: synchronize(device), step_stamp(device)):
            trainer.should_stop = True


class TorchLoop:
    """The task's network trained by a plain loop: `feed` = "tensors" (one batch of random tensors already on the
    device: the upper bound) or "dali" (the task's training pipeline through DALIGenericIterator). It runs where
    the plan puts DALI: on the GPU with "gpu", else on the CPU."""

    def __init__(self, task, cfg: DictConfig, dataset, plan, feed: str, warmup: int, steps: int):
        self.task, self.cfg, self.dataset, self.plan, self.feed = task, cfg, dataset, plan, feed
        self.warmup, self.steps = warmup, steps
        self.device = torch.device("cuda" if plan.device == "gpu" else "cpu")
        self._state = None

    def _build(self):
        from hydrali.backends.lightning.module import make_optimizer

        device = self.device
        torch_task = get_method(self.task.torch_target)(self.task, self.cfg.model, self.dataset,
                                                        self.cfg.data.image_size).to(device)
        if self.cfg.backend.channels_last:
            torch_task.to(memory_format=torch.channels_last)
        if self.cfg.backend.compile:   # the compiled bound: the network compiled as the Lightning backend compiles it
            from hydrali.backends.lightning.module import compile_network

            b = self.cfg.backend
            compile_network(torch_task, mode=str(b.compile_mode), fullgraph=b.compile_fullgraph, dynamic=b.compile_dynamic)
        optimizer = make_optimizer(torch_task.parameters(), self.cfg.optim, self.plan.effective_lr)
        precision = str(self.cfg.backend.precision)
        scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None
        return torch_task, optimizer, precision, scaler, self._batches(device)

    def _batches(self, device):
        if self.feed == "tensors":
            size, batch = self.cfg.data.image_size, self.plan.per_replica_batch
            fixed = {"images": torch.randn(batch, 3, size, size, device=device),
                     "labels": torch.randint(0, self.dataset.num_classes, (batch, 1), device=device, dtype=torch.int32)}
            while True:
                yield fixed
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        pipe = self.task.build_pipeline(pipeline=self.cfg.pipeline, data=self.cfg.data, model=self.cfg.model,
                                        dataset=self.dataset, plan=self.plan, shard=self.plan.shard, layout="CHW",
                                        is_training=True)
        pipe.build()
        iterator = DALIGenericIterator([pipe], list(self.task.output_names(True)))
        while True:
            yield next(iterator)[0]

    def once(self):
        """The Timing of `steps` optimizer steps after `warmup` (CUDA synchronized on the GPU, each step's end
        marked)."""
        if self._state is None:
            self._state = self._build()
        torch_task, optimizer, precision, scaler, batches = self._state
        torch_task.train()

        def step():
            batch = next(batches)
            dtype = AUTOCAST.get(precision)
            cast = torch.autocast(self.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
            with cast:
                loss, _ = torch_task.training_loss(batch)
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            return loss

        return time_steps(step, warmup=self.warmup, steps=self.steps, images_per_step=self.plan.per_replica_batch,
                          sync=lambda out: synchronize(self.device),
                          stamp=step_stamp(self.device))

    def close(self) -> None:
        """Free the network, its optimizer and the pipeline."""
        self._state = None
        torch.cuda.empty_cache()
