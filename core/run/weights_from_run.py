"""`model.weights` naming an earlier hydrali run: which of its checkpoints a new run's network starts from, and
whether it can, decided once for every backend.

A run is named by its dir (which holds checkpoints/trained_with.json) or by a checkpoint file in such a
checkpoints/ folder. From a dir the network starts from the run's best checkpoint (its summary names it), else
from its newest. Only the network's weights are taken, not the optimizer's state or the epoch: the new run trains
from epoch 1, with a new head when the classes differ. Refused, each in one line, before anything is written: a
run of another backend, of another task, or of another network (naming both).

The network's settings come with its weights: those of the run's model node that this command line does not set are
taken (`adopt`), as pretrained weights' config sets data.image_size, so that a run at 224 px starts from one at 32 px
without restating the stem the image size chose there.
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf, open_dict

from hydrali.core.contracts.registry import backend_of_checkpoint, backend_spec, network_keys
from hydrali.core.contracts.task import FINE_TUNING_KEYS, PREPROCESSING_KEYS, STARTING_POINT_KEYS
from hydrali.core.errors import HydraliError, first_line
from hydrali.core.run.checkpoints import CHECKPOINT_DIR, TRAINED_WITH
from hydrali.core.run.run_dir import _flat, differences, override_key, set_on_command_line
from hydrali.core.run.summary import SUMMARY_FILE

NOT_THE_NETWORK = FINE_TUNING_KEYS + PREPROCESSING_KEYS + STARTING_POINT_KEYS  # model keys that may differ
AS_BUILT = {"weights": None, "pretrained": False, "freeze": None}  # a network as its builder makes it, untrained
log = logging.getLogger("hydrali")


@dataclass(frozen=True)
class RunWeights:
    """The checkpoint of an earlier run that a network starts from, and what that run trained."""

    checkpoint: Path
    trained_with: dict  # that run's trained_with.json: task, model (its resolved node), num_classes, optim

    @property
    def num_classes(self) -> int:
        """The number of classes of that run's head."""
        return int(self.trained_with["num_classes"])

    def model(self) -> DictConfig:
        """That run's model node, building its network as it was before training (no weights of its own, nothing
        frozen), so that the checkpoint can be loaded into it."""
        return as_built(self.trained_with["model"])

    def announce(self, head_taken: bool) -> None:
        """Log, the same on every backend, that the network started from this checkpoint, and whether its head did."""
        head = "its head too" if head_taken else f"a new head: {self.num_classes} classes there"
        log.info("model.weights: the network starts from %s (%s)", self.checkpoint, head)


def as_built(model) -> DictConfig:
    """A copy of the `model` node (a DictConfig or dict) that builds its network untrained (AS_BUILT): what a
    checkpoint of a run of that model is loaded into."""
    node = OmegaConf.create(OmegaConf.to_container(model, resolve=True) if isinstance(model, DictConfig) else model)
    for key, value in AS_BUILT.items():
        if key in node:
            node[key] = value
    return node


def names_a_run(weights) -> bool:
    """Whether `model.weights` names a hydrali run: its dir, or a checkpoint file in its checkpoints/ folder."""
    if weights is None:
        return False
    path = Path(str(weights)).expanduser()
    in_a_run = path.is_file() and (path.parent / TRAINED_WITH).is_file()
    return in_a_run or (path / CHECKPOINT_DIR / TRAINED_WITH).is_file()


def find(weights, backend: str, newest: Callable[[Path], Path | None]) -> RunWeights | None:
    """The checkpoint `model.weights` names, for a run on `backend` (`newest(dir)`: its newest checkpoint in a dir);
    None when it names no hydrali run. One line when the run is of another backend or holds no checkpoint."""
    if not names_a_run(weights):
        return None
    path = Path(str(weights)).expanduser().resolve()
    folder = path / CHECKPOINT_DIR if path.is_dir() else path.parent
    checkpoint = best_or_newest(path, folder, newest) if path.is_dir() else path
    owners = sorted({b for f in folder.iterdir() if (b := backend_of_checkpoint(f)) is not None})
    owner = backend_of_checkpoint(checkpoint) if checkpoint is not None else (owners[0] if owners else None)
    if owner is not None and owner != backend:
        raise HydraliError(
            f"model.weights={weights} is a run of backend={owner}: a network starts from the weights of a run of its "
            f"own backend; pass backend={owner}, or a run of backend={backend}"
        )
    if checkpoint is None:
        raise HydraliError(f"model.weights={weights}: {folder} holds no checkpoint: pass a run that trained an epoch")
    try:
        trained_with = json.loads((folder / TRAINED_WITH).read_text())
    except (OSError, ValueError) as err:
        raise HydraliError(
            f"model.weights={weights}: {folder / TRAINED_WITH} cannot be read ({first_line(err)})"
        ) from err
    return RunWeights(checkpoint, trained_with)


def adopt(cfg: DictConfig, overrides: list[str]) -> dict:
    """Set in `cfg.model` the network settings of the run `model.weights` names, but for keys `overrides` set
    (model.<key> on the command line); return what was set (dotted key -> value), logged once. Nothing when the
    command line names a network (model=...), or `model.weights` names no run, a run of another task or of another
    builder, or one that cannot be read: `check` then says why in one line where they differ."""
    weights = cfg.model.get("weights")
    if not names_a_run(weights):
        return {}
    try:
        then = json.loads(_trained_with_file(weights).read_text())
    except (OSError, ValueError):
        return {}
    if then.get("task") != cfg.task.name or not isinstance(then.get("model"), dict):
        return {}
    if any(override_key(o) == "model" for o in overrides):  # model=<a network> named: its settings, or `check` says
        return {}
    network = _network(then["model"])
    own = _network(OmegaConf.to_container(cfg.model, resolve=True))
    if _builders_differ(network, own):
        return {}
    network, own = _flat(network, "model."), _flat(own, "model.")
    taken = {
        key: value
        for key, value in network.items()
        if own.get(key) != value and not set_on_command_line(key, overrides)
    }
    with open_dict(cfg):
        for key, value in taken.items():
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    if taken:
        log.info(
            "model.weights=%s: that run's network settings, where the command line sets none: %s",
            weights,
            ", ".join(f"{key}={value}" for key, value in taken.items()),
        )
    return taken


def _trained_with_file(weights) -> Path:
    """The trained_with.json of the run `model.weights` names (its dir, or a checkpoint in its checkpoints/)."""
    path = Path(str(weights)).expanduser()
    return path.parent / TRAINED_WITH if path.is_file() else path / CHECKPOINT_DIR / TRAINED_WITH


def check(cfg: DictConfig, newest: Callable[[Path], Path | None]) -> RunWeights | None:
    """Whether this run's network can start from what `model.weights` names, in one line when it cannot: a run of
    this backend, task and network, or (not a run) a file the model's own builder reads."""
    weights = cfg.model.get("weights")
    if weights is None:
        return None
    found = find(weights, str(cfg.backend.name), newest)
    if found is None:
        _check_builder_reads(cfg, weights)
        return None
    then = found.trained_with
    if then.get("task") != cfg.task.name:
        raise HydraliError(
            f"model.weights={weights} is a run of task={then.get('task')}, this run is task={cfg.task.name}: pass a "
            f"run of task={cfg.task.name}"
        )
    network, own = _network(then.get("model", {})), _network(OmegaConf.to_container(cfg.model, resolve=True))
    if _builders_differ(network, own):
        builders = differences(*({key: node.get(key) for key in network_keys()} for node in (network, own)))
        raise HydraliError(
            f"model.weights={weights} is a run of another model ({builders}): pass the model= "
            f"that run trained (its .hydra/overrides.yaml), or a run of this model"
        )
    what = differences({"model": network}, {"model": own})  # dotted as the config's keys (registry.added_keys)
    if what:
        raise HydraliError(
            f"model.weights={weights} trained another network ({what}): leave those model settings off the command "
            f"line (that run's come with its weights), or pass a run of this network"
        )
    return found


def _builders_differ(network: dict, own: dict) -> bool:
    """Whether two model nodes' networks are built by other code (a builder of any framework: network_keys)."""
    return any(network.get(key) != own.get(key) for key in network_keys())


def _network(model: dict) -> dict:
    """The keys of a model node that say which network it builds."""
    return {key: value for key, value in model.items() if key not in NOT_THE_NETWORK}


def best_or_newest(run: Path, folder: Path, newest: Callable[[Path], Path | None]) -> Path | None:
    """The checkpoint of `folder` (a run's checkpoints/) that the run's summary names best, else its newest."""
    summary = run / SUMMARY_FILE
    if summary.is_file():
        try:
            best = json.loads(summary.read_text()).get("best_checkpoint")
        except ValueError:
            best = None
        if best and (folder / Path(best).name).is_file():  # by its name: the run dir may have moved since
            return folder / Path(best).name
    return newest(folder)


def builder_reads_files(target: str) -> bool:
    """Whether the network builder `target` ("module.callable") reads weights files itself (takes `weights`, as
    model=timm's do); True when it cannot be imported (the build then names it)."""
    from hydra.utils import get_method

    try:
        return "weights" in inspect.signature(get_method(str(target))).parameters
    except Exception:  # noqa: BLE001 - a builder that cannot be imported is named when the network is built
        return True


def _check_builder_reads(cfg: DictConfig, weights) -> None:
    """model.weights that names no run: a file or dir the network's builder reads itself (model=timm), or one line."""
    path = Path(str(weights)).expanduser()
    if not path.exists():
        raise HydraliError(f"model.weights={weights}: no such file or directory")
    target = cfg.model.get(backend_spec(str(cfg.backend.name)).network_key)
    if not builder_reads_files(str(target)):
        raise HydraliError(
            f"model.weights={weights} is not a hydrali run (its dir, or a checkpoint in its checkpoints/ folder): "
            f"model={target} starts from such a run only (model=timm also reads timm's weights files)"
        )
