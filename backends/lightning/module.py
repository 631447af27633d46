"""The torch side of a task as the Lightning backend trains it, and the LightningModule around it.

Its builders are public so that what the benchmark measures (bench/torch_loops.py) is built by the same
code: the task's torch side, its memory format and compilation, the optimizer and lr schedule of the plan, and the
precision plugin of `backend.precision`.
"""

from __future__ import annotations

import lightning as L
import torch
from hydra.errors import InstantiationException
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from omegaconf import DictConfig

from hydrali.backends.lightning.spec import SPEC
from hydrali.core.config.schema import Optimizer
from hydrali.core.contracts.backend import TrainingDevice
from hydrali.core.contracts.task import side_builder
from hydrali.core.distributed import gather
from hydrali.core.errors import HydraliError, first_line
from hydrali.core.optim.optimizer import ADAM_EPSILON, decays
from hydrali.core.optim.schedule import lr_factor
from hydrali.core.run.plan import Plan
from hydrali.core.run.weights_from_run import RunWeights


def build_torch_side(task, cfg: DictConfig, dataset) -> torch.nn.Module:
    """The task's torch side (network, loss, metrics) for `dataset`, with the network of `cfg.model` at
    `cfg.data.image_size`; a HydraliError names the side or the model that cannot be built."""
    build = side_builder(task, SPEC.framework, SPEC.name)
    try:
        return build(task, cfg.model, dataset, cfg.data.image_size)
    except (InstantiationException, TypeError, ValueError) as err:
        raise HydraliError(f"model={cfg.model.get('_target_')} cannot be built: {err}") from err


SIDE = "torch_task"  # HydraliModule's attribute holding the task's torch side: its checkpoint keys start so


def start_side_from(side: torch.nn.Module, start: RunWeights, weights: str) -> None:
    """Start the network of the task's torch `side` from the checkpoint of an earlier run (model.weights, found by
    hydrali.core.run.weights_from_run): its network's weights only, a new head when the classes differ."""
    initialise = getattr(side, "initialise_from", None)
    if initialise is None:
        raise HydraliError(f"model.weights={weights}: the task's torch side ({type(side).__name__}) cannot take it")
    try:
        state = torch.load(start.checkpoint, map_location="cpu", weights_only=True, mmap=True)["state_dict"]
    except Exception as err:  # torch raises many types for a file that is not a checkpoint
        raise HydraliError(f"model.weights={weights}: {start.checkpoint} cannot be read ({first_line(err)})") from err
    prefix = SIDE + "."
    try:
        head = initialise({key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)})
    except HydraliError as err:
        raise HydraliError(f"model.weights={weights}: {start.checkpoint}: {err}") from err
    start.announce(head)


OPTIMIZERS = {  # optim.name -> torch's optimizer over parameter groups, with the optim node's settings
    Optimizer.sgd: lambda groups, optim, lr: torch.optim.SGD(
        groups, lr=lr, momentum=optim.momentum, nesterov=optim.nesterov
    ),
    Optimizer.adamw: lambda groups, optim, lr: torch.optim.AdamW(
        groups, lr=lr, betas=tuple(optim.betas), eps=ADAM_EPSILON
    ),
}


def make_optimizer(parameters, optim: DictConfig, lr: float, backbone=()) -> torch.optim.Optimizer:
    """SGD (torch's coupled weight decay) or AdamW (decoupled), decaying only what
    hydrali.core.optim.optimizer.decays says; the `backbone` parameters at lr x optim.backbone_lr_mult."""
    parameters, slow = list(parameters), {id(p) for p in backbone}
    groups = []
    for in_backbone, factor in ((False, 1.0), (True, float(optim.get("backbone_lr_mult", 1.0)))):
        part = [p for p in parameters if (id(p) in slow) == in_backbone]
        if in_backbone and not part:
            continue
        decay, no_decay = [p for p in part if decays(p.shape)], [p for p in part if not decays(p.shape)]
        groups += [
            {"params": decay, "weight_decay": optim.weight_decay, "lr": lr * factor},
            {"params": no_decay, "weight_decay": 0.0, "lr": lr * factor},
        ]
    return OPTIMIZERS[Optimizer.of(optim.name, "optim.name")](groups, optim, lr)


def make_schedule(
    optimizer: torch.optim.Optimizer, optim: DictConfig, plan: Plan, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The lr schedule of the plan, stepped after every optimizer step: the optimizer's lr times
    hydrali.core.optim.schedule.lr_factor (warmup, then cosine or constant, over plan.epochs epochs)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(
            step,
            steps_per_epoch=steps_per_epoch,
            epochs=plan.epochs,
            warmup_epochs=optim.warmup_epochs,
            warmup_div=optim.warmup_div,
            schedule=str(optim.schedule),
        ),
    )


def training_device_of(device: torch.device) -> TrainingDevice:
    """`device` as core's `auto` settings need it: a CUDA device's name and compute capability, or the CPU."""
    if device.type != "cuda":
        return TrainingDevice("cpu", "CPU")
    return TrainingDevice("gpu", torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device)))


def precision_plugin(precision: str, device_type: str) -> Precision:
    """Lightning's precision plugin for `backend.precision` on one device of `device_type` (cpu | cuda), as the
    Trainer builds it from `precision=`: autocast in its `forward_context()`, and its `scaler` with 16-mixed."""
    if precision == "32-true":
        return Precision()
    if precision == "16-mixed" and device_type == "cpu":
        precision = "bf16-mixed"  # as the Trainer does: torch has no float16 autocast with a scaler on the CPU
    return MixedPrecision(precision, device_type)


def compile_network(
    torch_task: torch.nn.Module, *, mode: str = "default", fullgraph: bool = False, dynamic: bool | None = None
) -> torch.nn.Module:
    """torch.compile the task's network (its `model`) in place: its `forward` becomes the compiled one, with no
    wrapper module, so the state_dict keys stay as they are and a checkpoint loads whether it was written compiled
    or not. Training and validation both call the compiled network; the loss and metrics around it run eagerly.
    (nn.Module.compile would compile `__call__`, which TorchDynamo skips for a network made of torch.nn containers
    only, such as an nn.Sequential: nothing would be compiled.) Returns the network."""
    network = getattr(torch_task, "model", None)
    if not isinstance(network, torch.nn.Module):
        raise HydraliError(
            f"backend.compile=true: the task's torch side ({type(torch_task).__name__}) keeps no "
            f"network in `.model` to compile: set backend.compile=false"
        )
    network.forward = torch.compile(network.forward, mode=mode, fullgraph=fullgraph, dynamic=dynamic)
    return network


def compile_torch_side(torch_task: torch.nn.Module, backend: DictConfig) -> torch.nn.Module:
    """compile_network with the `backend` node's compile_mode, compile_fullgraph and compile_dynamic."""
    return compile_network(
        torch_task, mode=str(backend.compile_mode), fullgraph=backend.compile_fullgraph, dynamic=backend.compile_dynamic
    )


EPOCH_LOSS_KEY = "hydrali_epoch_loss"  # a checkpoint's [sum of loss x samples, samples] of the epoch in progress,
#   one pair per process, by global rank


class HydraliModule(L.LightningModule):
    """Trains `torch_task` (model + loss + metrics) with SGD/AdamW at the plan's effective lr."""

    def __init__(
        self,
        torch_task: torch.nn.Module,
        optim: DictConfig,
        plan: Plan,
        steps_per_epoch: int,
        channels_last: bool = False,
        step_loss_in_bar: bool = False,
    ):
        super().__init__()
        self.torch_task = torch_task  # named SIDE
        self.optim = optim
        self.plan = plan
        self.steps_per_epoch = steps_per_epoch
        self.step_loss_in_bar = step_loss_in_bar
        if channels_last:
            self.torch_task.to(memory_format=torch.channels_last)
        # this process's sum of loss x samples and its samples over the epoch so far, kept in checkpoints: an epoch
        # resumed in its middle has the train/loss of the uninterrupted epoch
        self._loss_sum: torch.Tensor | float = 0.0
        self._loss_samples = 0

    def on_train_epoch_start(self) -> None:
        self._loss_sum, self._loss_samples = 0.0, 0

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Every process's sums of the epoch in progress, by global rank (a collective: Lightning builds the
        checkpoint on every process and writes rank 0's)."""
        checkpoint[EPOCH_LOSS_KEY] = gather.gather_objects([float(self._loss_sum), self._loss_samples])

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """This process's sums of the epoch in progress (a checkpoint of one pair: written by one process, or
        before the pairs were gathered; of another number of processes: the epoch's loss starts afresh)."""
        pairs = checkpoint.get(EPOCH_LOSS_KEY, [0.0, 0])
        if pairs and not isinstance(pairs[0], (list, tuple)):
            pairs = [pairs]
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self._trainer is not None else (0, 1)
        self._loss_sum, self._loss_samples = pairs[rank] if len(pairs) == world else (0.0, 0)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, n = self.torch_task.training_loss(batch)
        self._loss_sum = self._loss_sum + loss.detach().double() * n
        self._loss_samples += n
        if batch_idx == self.trainer.num_training_batches - 1:
            # the epoch's mean over every process, synced once at the epoch's end (a step value with sync_dist
            # would all-reduce at every step)
            mean = self._loss_sum / self._loss_samples
            self.log("train/loss", mean, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
        # a progress bar shows this process's own loss of each step
        if self.step_loss_in_bar:
            self.log("loss", loss, on_step=True, on_epoch=False, prog_bar=True, logger=False, batch_size=n)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        if next(iter(batch.values())).shape[0] == 0:
            return  # a batch of padding only (a shard shorter than the others by a whole batch): nothing to score
        loss, n = self.torch_task.validation_step(batch)
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, batch_size=n, sync_dist=True)
        self.log("val/images", float(n), on_epoch=True, reduce_fx="sum", sync_dist=True, batch_size=1)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            self.torch_task.val_metrics_reset()
            return
        # the task's metrics over the whole validation set, already gathered from every process
        metrics = self.torch_task.val_metrics_compute(self.current_epoch)
        self.log_dict({name: float(value) for name, value in metrics.items()}, prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        backbone = []  # with optim.backbone_lr_mult, from a side that tells its backbone from its head
        if self.optim.get("backbone_lr_mult", 1.0) != 1.0:
            backbone = self.torch_task.backbone_parameters()
        opt = make_optimizer(self.torch_task.parameters(), self.optim, self.plan.effective_lr, backbone)
        schedule = make_schedule(opt, self.optim, self.plan, self.steps_per_epoch)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
