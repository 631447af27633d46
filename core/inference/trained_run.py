"""A trained run as `hydrali eval|predict|export` open it: its own config (composed again from its run.json, its
locations pinned) with the command's keys on top, and the checkpoint the command uses (`ckpt=best|last|<file>`).
Refused, each in one line, before anything is read or written: a dir that is no run, a run without a checkpoint, a
checkpoint of another backend, a key that is not a setting, a backend, task or model other than the run's. The config
is the one the run recorded (its run.json): the settings of the day it trained, the pretrained weights' preprocessing
it took; keys named on the command line win."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from hydrali.core.config.schema import HydraliConfig
from hydrali.core.contracts.registry import added_keys, backend_of_checkpoint
from hydrali.core.errors import CompositionError, HydraliError
from hydrali.core.inference.schema import SCHEMAS
from hydrali.core.run import run_dir
from hydrali.core.run.checkpoints import CHECKPOINT_DIR, check_readable
from hydrali.core.run.summary import SUMMARY_FILE

BEST, LAST = "best", "last"  # the named checkpoints of `ckpt`
NOT_TAKEN_FROM_THE_RUN = ("ckpt_path",)  # recorded overrides of the training command that mean nothing here
FIXED_BY_THE_RUN = {"backend", "task", "model"}  # settings the command may not change: they make another run
# the preprocessing the network was trained on (and an export's preprocessing.json states): another would score or
# serve a network on images it never saw (e.g. data.image_size=64 on a 32 px run scored 0.29 where it reached 0.44)
PREPROCESSING_OF_THE_RUN = (
    "data.image_size",
    "pipeline",
    "pipeline.recipe",
    "pipeline.options.mean",
    "pipeline.options.std",
    "pipeline.options.val_crop_fraction",
)


@dataclass(frozen=True)
class TrainedRun:
    """A run dir, its config for a command, and the checkpoint the command uses."""

    run_dir: Path
    cfg: DictConfig  # the run's config (hydrali's keys, with the command's overrides); paths.output_dir is the run dir
    options: DictConfig  # the command's own keys (core/inference/schema.py), e.g. ckpt, split
    run_file: run_dir.RunFile
    checkpoint_dir: Path

    @property
    def backend(self) -> str:
        """The backend that trained the run."""
        return str(self.cfg.backend.name)


def compose(command: str, overrides: list[str]) -> tuple[DictConfig, DictConfig]:
    """(hydrali's config, the command's own keys) that conf/<command>.yaml composes from `overrides`
    (${hydra:runtime.cwd} resolving to this directory); a key that is not a setting, or a bad value, is one line."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.hydra_config import HydraConfig

    try:
        with initialize_config_module(config_module="hydrali.conf", version_base="1.3"):
            cfg = hydra_compose(command, overrides=overrides, return_hydra_config=True)
    except Exception as err:  # Hydra's composition errors: many types
        raise CompositionError(err, overrides) from err
    HydraConfig.instance().set_config(cfg)
    own = {f.name for f in fields(SCHEMAS[command])} - {f.name for f in fields(HydraliConfig)}
    try:
        values = {key: cfg[key] for key in sorted(own)}  # resolved
    except Exception as err:  # an interpolation that cannot be resolved
        raise CompositionError(err, overrides) from err
    options = OmegaConf.create({key: v.value if isinstance(v, Enum) else v for key, v in values.items()})
    with open_dict(cfg):
        for key in ("hydra", *own):
            del cfg[key]
    return cfg, options


def open_run(command: str, path: str | None, overrides: list[str]) -> TrainedRun:
    """The run in `path` configured for `hydrali <command>`: the config it trained with (its run.json), with
    `overrides` on top (the command's keys and any of hydrali's, e.g. data.root or pipeline.device), its locations
    pinned unless named. What would make it another run (its backend, task or model) is refused in one line."""
    usage = f"hydrali {command} RUN_DIR [key=value ...]"
    where = Path(path).expanduser().resolve() if path else None
    if where is None or (not where.is_dir() and "=" in str(path)):
        raise HydraliError(f"{usage}: name the run dir first (the hydra.run.dir of a training run)")
    if not where.is_dir():
        raise HydraliError(f"{usage}: {path} does not exist: pass the dir of a training run")
    run_file = run_dir.read(where)
    if run_file is None:
        raise HydraliError(
            f"{path} holds no hydrali run ({run_dir.RUN_FILE} is missing): pass the dir of a run that trained"
        )
    try:
        named = {run_dir.override_key(o) for o in overrides}
        recorded = [o for o in run_file.overrides if run_dir.override_key(o) not in NOT_TAKEN_FROM_THE_RUN]
        merged = run_dir.merge_overrides(recorded, overrides)
    except Exception as err:  # Hydra's override parser: a malformed override
        raise CompositionError(err, overrides) from err
    if "ckpt_path" in named:
        raise HydraliError("ckpt_path= resumes training: pass ckpt=best|last|<checkpoint file> to choose the weights")
    fixed = sorted(named & FIXED_BY_THE_RUN)
    if fixed:
        raise HydraliError(
            f"{fixed[0]}= cannot be set: {path} was trained with {fixed[0]}={_recorded(run_file, fixed[0])}, which "
            f"its checkpoints hold (ckpt= chooses the checkpoint)"
        )
    cfg, options = compose(command, merged)
    preprocessing = sorted(key for key in named if key in PREPROCESSING_OF_THE_RUN or key.startswith("model."))
    changed = [key for key in preprocessing if _value_of(cfg, key) != _recorded_value(run_file, key)]
    if changed:  # the same value again (a script repeating the training overrides) changes nothing
        key = changed[0]
        raise HydraliError(
            f"{key}= cannot be set: {path} was trained with {key}={_recorded_value(run_file, key)}, and "
            f"hydrali {command} feeds its network as it trained (its preprocessing and network settings are the run's)"
        )
    run_dir.pin_locations(cfg, run_file, overrides, where)
    _take_recorded_values(cfg, run_file.config, named)
    return TrainedRun(where, cfg, options, run_file, where / CHECKPOINT_DIR)


def _recorded(run_file: run_dir.RunFile, key: str) -> str:
    node = run_file.config.get(key, {})
    return str(node.get("name", node.get("_target_", "?"))) if isinstance(node, dict) else str(node)


def _plain(value):
    """A config value as plain data for comparing: a group's node as its name, a list or node as Python data."""
    if isinstance(value, (dict, DictConfig)):
        return str(value.get("name", value.get("recipe", "?")))
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _value_of(cfg: DictConfig, key: str):
    """The composed value of the dotted `key` as plain data (a group: its name)."""
    return _plain(OmegaConf.select(cfg, key))


def _recorded_value(run_file: run_dir.RunFile, key: str):
    """The value the run recorded for the dotted `key` as plain data (a group: its name; a key added since the run
    was recorded: the value it trained with, registry.added_keys; None: not recorded)."""
    node = run_file.config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    task = (run_file.config.get("task") or {}).get("name")
    backend = (run_file.config.get("backend") or {}).get("name")
    return _plain(added_keys(task, backend).get(key) if node is None else node)


def _take_recorded_values(cfg: DictConfig, recorded: dict, named: set[str]) -> None:
    """Set in `cfg` every value the run recorded (its resolved config: the pretrained weights' preprocessing, the
    defaults of the day it trained) but those of keys `named` on the command line and those that differ between
    attempts by design."""
    skipped = tuple(named) + run_dir.not_compared()
    for key, value in _leaves(recorded):
        if key in skipped or key.startswith(tuple(f"{k}." for k in skipped)):
            continue
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            continue  # a setting that no longer exists
        OmegaConf.update(cfg, key, value, merge=False)


_ABSENT = object()


def _leaves(node, prefix: str = ""):
    """(dotted key, value) of each leaf of nested dicts (lists are leaves)."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), node


def _say_when_not_the_best_epoch(run_dir: Path, checkpoint: Path) -> None:
    """One line when the run's best checkpoint holds another epoch than its best (that epoch was not checkpointed):
    which epoch is scored, and why."""
    from hydrali.core.run.summary import read_summary

    summary = read_summary(run_dir) if (run_dir / SUMMARY_FILE).is_file() else None
    if not summary or Path(str(summary.get("best_checkpoint"))).name != checkpoint.name:
        return
    held, best = summary.get("best_checkpoint_epoch"), summary.get("best_epoch")
    if held is not None and best is not None and held != best:
        print(
            f"hydrali: ckpt=best takes {checkpoint.name}, epoch {held}: the run's best epoch, {best}, was not "
            f"checkpointed (checkpoint_every); ckpt=<file> chooses another of {checkpoint.parent}",
            flush=True,
        )


def checkpoint_of(run: TrainedRun, newest) -> Path:
    """The checkpoint `ckpt` names in the run (`newest(dir)`: the backend's newest checkpoint in a dir): best (the
    best epoch per the run's summary, else the newest), last, or a file of the run's backend."""
    from hydrali.core.run.weights_from_run import best_or_newest

    ckpt = str(run.options.ckpt)
    folder = run.checkpoint_dir
    if ckpt in (BEST, LAST):
        if ckpt == BEST and not (run.run_dir / SUMMARY_FILE).is_file():
            print(f"hydrali: {run.run_dir} has no {SUMMARY_FILE} (it did not finish): ckpt=best takes its newest")
        found = best_or_newest(run.run_dir, folder, newest) if ckpt == BEST else newest(folder)
        if found is None:
            raise HydraliError(
                f"{run.run_dir} holds no checkpoint ({folder} is empty or missing): train at least one epoch, or "
                f"resume the run with `hydrali ckpt_path=last hydra.run.dir={run.run_dir}`"
            )
        check_readable(found, f"ckpt={ckpt}")
        if ckpt == BEST:
            _say_when_not_the_best_epoch(run.run_dir, found)
        return found
    path = Path(ckpt).expanduser()
    if not path.is_absolute() and not path.exists():
        path = folder / ckpt  # a file name of the run's checkpoints/
    if not path.is_file():
        raise HydraliError(f"ckpt={ckpt}: no such file: pass best, last, or a checkpoint file of {folder}")
    owner = backend_of_checkpoint(path)
    if owner != run.backend:
        raise HydraliError(
            f"ckpt={ckpt} is not a checkpoint of backend={run.backend}, which trained {run.run_dir}: pass one of "
            f"{folder}"
        )
    check_readable(path, f"ckpt={ckpt}")
    return path.resolve()


def plain(cfg: DictConfig) -> dict:
    """`cfg` resolved to plain data (for the files a command writes)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
