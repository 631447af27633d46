"""What every command on a trained run sets up, in the order that refuses bad input before anything is written:
the task, the backend and the checkpoint, then the data it reads (its classes checked against the run's), the
device, and the network with its weights."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import instantiate

from hydrali.core.config.validate import check_config
from hydrali.core.contracts.backend import Backend, TrainedNetwork
from hydrali.core.contracts.registry import backend_spec, load_backend
from hydrali.core.data.devices import resolve_device
from hydrali.core.errors import HydraliError
from hydrali.core.inference.batches import count_batches, read_batches
from hydrali.core.inference.trained_run import TrainedRun, checkpoint_of
from hydrali.core.policies import auto_settings
from hydrali.core.run.checkpoints import TRAINED_WITH
from hydrali.core.run.contract import backend_settings, trained_run_spec


@dataclass
class Loaded:
    """A trained run ready to infer: its task, the data read, its backend, checkpoint, device and network."""

    run: TrainedRun
    task: Any
    dataset: Any
    backend: Backend
    checkpoint: Path
    device: str  # where DALI runs: cpu | gpu
    network: TrainedNetwork

    def batches(self, what: str) -> Iterator[dict[str, Any]]:
        """The validation recipe's batches of the data loaded, as NumPy, with a progress bar named `what` on a
        terminal."""
        from tqdm import tqdm

        cfg = self.run.cfg
        batches = read_batches(
            task=self.task, cfg=cfg, dataset=self.dataset, layout=self.backend.layout, device=self.device
        )
        total = count_batches(self.dataset.num_val, cfg.data.batch_size)
        return tqdm(batches, total=total, desc=what, unit="batch", disable=not sys.stderr.isatty(), leave=False)

    def describe(self) -> str:
        """One line naming the run, its task and backend, the checkpoint and the device."""
        cfg = self.run.cfg
        where = (
            self.checkpoint.relative_to(self.run.run_dir)
            if self.checkpoint.is_relative_to(self.run.run_dir)
            else self.checkpoint
        )
        return f"{self.run.run_dir}: {cfg.task.name} / {cfg.backend.name}, {where}, DALI on {self.device}"


def load(run: TrainedRun, data: Callable[[Any], Any], needs: str) -> Loaded:
    """Set up `run` for a command, refusing what cannot work before anything is read in bulk or written: its task
    (which must have the method `needs`), its backend and checkpoint, then the data `data(task)` prepares (its
    classes those the run trained on), and the network loaded from the checkpoint."""
    cfg = run.cfg
    check_config(cfg)
    task = instantiate(cfg.task)
    if not hasattr(task, needs):
        raise HydraliError(f"task={cfg.task.name} cannot do this yet (its task has no `{needs}`)")
    backend = load_backend(run.backend)
    checkpoint = checkpoint_of(run, backend.newest_checkpoint)
    dataset = data(task)
    _check_classes(run, dataset)
    device = resolve_device(str(cfg.pipeline.device), backend.visible_gpus(), backend_spec(run.backend).framework_label)
    trains_on = backend.training_device(backend_settings(cfg.backend, decided=False))
    auto_settings.resolve(cfg, trains_on)  # `auto` precision: as a run here would decide
    network = backend.load_trained(run=trained_run_spec(cfg), task=task, dataset=dataset, checkpoint=checkpoint)
    return Loaded(run, task, dataset, backend, checkpoint, device, network)


def _check_classes(run: TrainedRun, dataset) -> None:
    """The data's classes are those the run trained on (as its trained_with.json names them, when it does)."""
    recorded = run.checkpoint_dir / TRAINED_WITH
    then = json.loads(recorded.read_text()).get("classes") if recorded.is_file() else None
    now = getattr(dataset, "classes", None)
    if then is None or now is None or list(then) == list(now):
        return
    differ = next((f"{a!r} there, {b!r} here" for a, b in zip(then, now) if a != b), f"{len(then)} vs {len(now)}")
    raise HydraliError(
        f"{run.run_dir} was trained on other classes than data.root={run.cfg.data.root} holds ({differ}): point "
        f"data.root at the data it trained on"
    )
