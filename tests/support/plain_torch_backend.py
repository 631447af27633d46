"""backend=plain: a third backend in a plain PyTorch loop, to show how little one needs. It trains from core's run
contract alone (hydrali.core.contracts.run: no config is read) with what every torch backend shares
(hydrali.backends.torch: the DALI loaders, the task's torch side, the optimizer and its schedule), and reports
each epoch through core's TrainingObserver, which writes the run's record: the same rows as on Lightning.

One process on the CPU, float32, eager. It saves the side's weights after every epoch as checkpoints/last.pt (keys
as in a Lightning checkpoint's state_dict), which `hydrali eval` (predict, export) loads; it does not resume. With
optim.ema_decay it keeps the average of the weights (hydrali.backends.torch.ema), which validation scores and
last.pt holds.
Registered from outside hydrali: tests/support/plain_torch_spec.py.
"""

from __future__ import annotations

import contextlib
import types
from pathlib import Path

import torch

from hydrali.backends.torch.device import training_device_of, use_cpu_threads
from hydrali.backends.torch.ema import WeightAverage
from hydrali.backends.torch.loaders import LAYOUT, DaliLoader, dali_loader
from hydrali.backends.torch.optim import make_optimizer, make_schedule
from hydrali.backends.torch.seeding import seed_torch
from hydrali.backends.torch.side import SIDE, build_torch_side
from hydrali.core.contracts.backend import TrainingDevice
from hydrali.core.contracts.run import RunContract, TrainedRunSpec
from hydrali.core.errors import HydraliError, first_line
from hydrali.core.process.preemption import Preempted, PreemptionWatch
from hydrali.core.run.checkpoints import CHECKPOINT_DIR
from hydrali.core.run.observer import TrainingObserver
from hydrali.core.run.record import RunRecord
from hydrali.core.run.results import FitResult
from tests.support.plain_torch_spec import SPEC, PlainBackendConfig

LAST = "last.pt"  # the checkpoint written after every epoch: {"state_dict": the side's weights, "epochs": n}


def train_epoch(
    epoch: int, side, loader: DaliLoader, optimizer, schedule, accumulate: int, observer, preemption, average=None
):
    """Train epoch `epoch` of the contract: the mean gradient of `accumulate` batches per optimizer step, the
    schedule stepped after each (as Lightning does) and the weights averaged into `average` (a WeightAverage, or
    None); stop after a step on a preemption signal (as Keras does: the epoch is not saved). The epoch's mean loss
    per sample."""
    side.train()
    loss_sum, samples = 0.0, 0
    for step, batch in enumerate(loader):
        observer.step_start(step, lambda: optimizer.param_groups[0]["lr"])
        loss, n = side.training_loss(batch)
        (loss / accumulate).backward()
        if (step + 1) % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
            schedule.step()
            if average is not None:
                average.update()
        loss_sum += loss.detach().double().item() * n
        samples += n
        observer.step_end()
        if preemption is not None and preemption.requested():
            raise Preempted(preemption.received, f"stopped at epoch {epoch + 1}, step {step + 1}")
    return loss_sum / samples


def validate(side, loader: DaliLoader, epoch: int) -> dict[str, float]:
    """Score the validation shard in evaluation mode: val/loss (the mean per sample), val/images and the task's
    metrics (its val_metrics_compute)."""
    side.eval()
    loss_sum, samples = 0.0, 0
    with torch.inference_mode():
        for batch in loader:
            if next(iter(batch.values())).shape[0] == 0:
                continue  # a batch of padding only
            loss, n = side.validation_step(batch)
            loss_sum += loss.double().item() * n
            samples += n
    metrics = {name: float(value) for name, value in side.val_metrics_compute(epoch).items()}
    return {"val/loss": loss_sum / samples, "val/images": float(samples), **metrics}


def save(side: torch.nn.Module, path: Path, epochs: int, average: WeightAverage | None = None) -> None:
    """The side's weights (with `average`, the averaged ones in place of the trained), keyed as a Lightning checkpoint
    keys them (hydrali.backends.torch.trained reads them)."""
    checkpoint = {"state_dict": side.state_dict(), "epochs": epochs}
    if average is not None:
        average.into_checkpoint(checkpoint)
    checkpoint["state_dict"] = {f"{SIDE}.{key}": value for key, value in checkpoint["state_dict"].items()}
    torch.save(checkpoint, path)


def fit(
    *,
    contract: RunContract,
    task,
    dataset,
    record: RunRecord,
    output_dir: Path,
    preemption: PreemptionWatch | None,
) -> FitResult:
    """Train `task` as the contract says: its plan's epochs, steps, lr and schedule."""
    plan = contract.plan
    seed_torch(plan.seed, contract.deterministic)  # a backend seeds its framework, as Lightning's does
    # as Lightning builds them: the loaders first, then the side (the same draw of initial weights after the seed)
    loaders = {
        split: dali_loader(task=task, contract=contract, dataset=dataset, is_training=split == "train")
        for split in ("train", "val")
    }
    side = build_torch_side(
        task, dataset, model=contract.task_inputs.model, image_size=contract.image_size, backend=SPEC.name
    )
    backbone = side.backbone_parameters() if contract.optim.backbone_lr_mult != 1.0 else []
    optimizer = make_optimizer(side.parameters(), contract.optim, plan.effective_lr, backbone)
    schedule = make_schedule(optimizer, contract.optim, plan, plan.epoch.optimizer_steps)
    average = None if contract.optim.ema_decay is None else WeightAverage(side, contract.optim.ema_decay)
    observer = TrainingObserver(
        record,
        images_per_batch=plan.images_per_batch,
        steps_per_epoch=plan.epoch.train_steps,
        warmup_steps=contract.throughput_warmup_steps,
    )
    checkpoint = output_dir / CHECKPOINT_DIR / LAST
    checkpoint.parent.mkdir(parents=True, exist_ok=True)

    for epoch in range(plan.epochs):
        if preemption is not None:
            preemption.reassert()  # after DALI's pipelines are built

        observer.epoch_start(epoch)
        train_loss = train_epoch(
            epoch, side, loaders["train"], optimizer, schedule, plan.accumulate, observer, preemption, average
        )
        validates = contract.validates(epoch + 1)  # every validate_every-th epoch and the last
        metrics = validated(side, loaders["val"], epoch, observer, average) if validates else {}
        if contract.saves_checkpoint(epoch + 1):  # one file, the newest: keep_checkpoints counts it
            save(side, checkpoint, epoch + 1, average)
        observer.epoch_end(epoch, {"train/loss": train_loss, **metrics}, validated=validates)
    return FitResult(best_checkpoint=str(checkpoint), **observer.fit_fields(start_epoch=0))


def validated(side, loader: DaliLoader, epoch: int, observer: TrainingObserver, average) -> dict[str, float]:
    """The epoch's validation (of the weight average with optim.ema_decay), observed."""
    observer.validation_start()
    if average is not None:  # validation scores the average
        average.swap_in()
    metrics = validate(side, loader, epoch)
    if average is not None:
        average.swap_out()
    return metrics


class PlainBackend:
    """backend=plain (core.contracts.backend.Backend): one process on the CPU."""

    layout = LAYOUT

    def visible_gpus(self) -> int:
        """0: it trains on the CPU (and DALI runs there too)."""
        return 0

    def replicas(self, backend: PlainBackendConfig, device: str) -> tuple[int, int, int]:
        """One replica in one process; backend.devices above 1 is refused."""
        if backend.devices != 1:
            raise HydraliError(f"backend.devices={backend.devices}: backend=plain trains in one process: pass 1")
        return 1, 1, 1

    def use_cpu_threads(self, threads: int) -> None:
        """torch's intra-op threads (core's cpu_threads)."""
        use_cpu_threads(threads)

    def training_device(self, backend: PlainBackendConfig) -> TrainingDevice:
        """The CPU."""
        return training_device_of(torch.device("cpu"))

    def processes_to_start(self, backend: PlainBackendConfig) -> int:
        """This process trains alone."""
        return 1

    def share_from_rank0(self, values: dict, plan) -> dict:
        """A process alone: its own values."""
        return values

    def newest_checkpoint(self, checkpoint_dir: Path) -> Path | None:
        """The run's last.pt, if there is one."""
        last = Path(checkpoint_dir) / LAST
        return last if last.is_file() else None

    def checkpoint_epochs(self, path: Path) -> int:
        """The epochs that a last.pt holds (core refuses a resume of a run whose epochs are done; fit any other)."""
        try:
            return int(torch.load(path, map_location="cpu", weights_only=True)["epochs"])
        except Exception as err:  # torch raises many types for a file that is not a checkpoint
            raise HydraliError(f"{path} cannot be read as a checkpoint of backend=plain ({first_line(err)})") from err

    def load_trained(self, *, run: TrainedRunSpec, task, dataset, checkpoint: Path):
        """The run's torch side with the weights of `checkpoint`, in float32 (hydrali.backends.torch.trained)."""
        from hydrali.backends.torch.trained import load_trained

        float32 = types.SimpleNamespace(forward_context=contextlib.nullcontext)  # no autocast
        return load_trained(
            run=run, task=task, dataset=dataset, checkpoint=checkpoint, precision=lambda _: float32, backend=SPEC.name
        )

    def fit(
        self,
        *,
        contract: RunContract,
        task,
        dataset,
        record: RunRecord,
        resume_from: Path | None,
        output_dir: Path,
        preemption: PreemptionWatch | None = None,
    ) -> FitResult:
        """Train as the contract says (a resume is refused: backend=plain keeps no optimizer state)."""
        if resume_from is not None:
            raise HydraliError(f"ckpt_path={resume_from}: backend=plain does not resume; start a new run")
        return fit(
            contract=contract, task=task, dataset=dataset, record=record, output_dir=output_dir, preemption=preemption
        )
