"""The run's network and optimizer built apart, trained by a plain loop: what `pipeline.autotune_by=training` times
its candidates with (hydrali.core.contracts.backend.TrainingProbe), and what the benchmark's torch loops train
(hydrali.bench.torch_loops). Each step is the one Lightning runs for the backend: the task's training loss
under the precision plugin's autocast (with its loss scaler for 16-mixed), backward, the optimizer and the lr
schedule; no Trainer around it."""

from __future__ import annotations

import torch
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from hydrali.backends.lightning.module import HydraliModule, precision_plugin
from hydrali.backends.lightning.spec import SPEC
from hydrali.backends.torch.device import synchronize
from hydrali.backends.torch.side import build_torch_side, compile_torch_side
from hydrali.core.contracts.run import RunContract


class LightningProbe:
    """The task's network, optimizer, schedule and precision as a run of `contract` builds them, on the GPU when the
    plan's DALI runs there (else the CPU)."""

    def __init__(self, *, contract: RunContract, task, dataset):
        plan = contract.plan
        self.task, self.plan = task, plan
        on_gpu = plan.device == "gpu"
        self.device = torch.device("cuda", plan.shards[0].device_id or 0) if on_gpu else torch.device("cpu")
        side = build_torch_side(
            task, dataset, model=contract.task_inputs.model, image_size=contract.image_size, backend=SPEC.name
        )
        module = HydraliModule(
            side,
            contract.optim,
            plan,
            plan.epoch.optimizer_steps,
            channels_last=contract.backend.channels_last,
        )
        if contract.compile:  # before the module moves, as the backend compiles it
            compile_torch_side(module.torch_task, contract.backend)
        module.to(self.device)
        optimizers = module.configure_optimizers()
        self.torch_task = module.torch_task
        self.optimizer = optimizers["optimizer"]
        self.schedule = optimizers["lr_scheduler"]["scheduler"]
        self.precision = precision_plugin(contract.precision, self.device.type)
        self.torch_task.train()

    def train_step(self, batch: dict) -> torch.Tensor:
        """One optimizer step on `batch` (tensors on this probe's device); returns the loss (not waited for)."""
        scaler = getattr(self.precision, "scaler", None)
        with self.precision.forward_context():
            loss, _ = self.torch_task.training_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(self.optimizer)
            scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.schedule.step()
        return loss

    def steps_on(self, pipe):
        """One training step per call on the next batch of `pipe` (built here, read through DALIGenericIterator as
        the backend reads it)."""
        iterator = DALIGenericIterator([pipe], list(self.task.output_names(True)))
        return lambda: self.train_step(next(iterator)[0])

    def wait(self, output) -> None:
        """Return once the queued steps have run."""
        synchronize(self.device)

    def close(self) -> None:
        """Free the network, its optimizer and the GPU memory they held."""
        self.torch_task = self.optimizer = self.schedule = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
