"""A run dir is self-contained: its own run file (run.json) and its lock.

`run.json`, written by the run's global rank 0 once its checks have passed, holds what the run depends on outside
its dir as absolute locations (`LOCATION_KEYS`: the data, the tracking store), the command's overrides, the
resolved config and the MLflow run id. A later `hydrali` in the same dir, from any working directory, reads it:

- with `ckpt_path` (`last` or a file), the run resumes as it was: its overrides are composed again with this
  command's on top, and its locations are pinned (unless this command names them);
- without, the same config resumes and another config is refused in one line that names the differing keys.

A finished run asked for again (the same config, without ckpt_path or with `last`) says so and exits 0, changing
nothing (core/run/finished.py).

Two processes never train in one run dir: the process that runs a job holds an exclusive lock on the dir itself
(flock on its descriptor: no file is written) until it ends, however it ends, and so do the processes it starts
for the job (core/process/live_processes.py); a second one is refused at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from hydrali.core.contracts.registry import added_keys, replaced_keys
from hydrali.core.errors import HydraliError
from hydrali.core.files import write_atomically
from hydrali.core.process import live_processes

log = logging.getLogger("hydrali")
RUN_FILE = "run.json"
ROOT_ENV = "HYDRALI_ROOT"  # the launch root Hydra puts outputs/ and multirun/ under (conf/config.yaml), else the cwd
HYDRA_FOLDERS = ("outputs", "multirun")  # the folders of hydra.run.dir and hydra.sweep.dir under it (conf/config.yaml)
TIMED = "${now:"  # in a configured (unresolved) dir: the dir is named by the time its run or sweep started
MAX_SAME_SECOND = 1000  # runs (or sweeps) started in one second under one timed name that get a dir of their own
_launch_folders: dict = {}  # note_launch_folders: the root, and which of HYDRA_FOLDERS existed before this command
# what a run reads or writes outside its dir: recorded as absolute locations, pinned when it is run again
LOCATION_KEYS = (
    "paths.root",
    "paths.data_dir",
    "tracking.uri",
    "tracking.artifact_location",
    "data.root",
    "model.weights",
)
NOT_COMPARED = ("ckpt_path", "paths.output_dir")  # differ between the attempts of one run by design
# how a run is validated, kept and shown, not what it trains: an attempt may change them
RUN_POLICIES = ("keep_checkpoints", "validate_every", "progress_bar")
_SQLITE = "sqlite:///"
_SHOWN_DIFFERENCES = 4  # how many differing keys a refusal names


@dataclass(frozen=True)
class RunFile:
    """What run.json holds."""

    overrides: list[str]  # the command-line overrides the run's config is composed from
    config: dict  # the resolved config (locations absolute)
    locations: dict[str, str | None]  # LOCATION_KEYS -> absolute location (None: not set)
    mlflow_run_id: str | None  # the run's MLflow run (None: tracking off)
    # what the latest attempt decided by itself and trained by (core.run.contract.decided_settings: the plan,
    #   autotune's choice, the `auto` settings as resolved); `config` keeps the settings as asked. Absent from
    #   run.json files written before it existed
    decided: dict = field(default_factory=dict)


def read(output_dir: str | os.PathLike) -> RunFile | None:
    """The run file of the run in `output_dir`, or None when no run was accepted there; one line if it is damaged."""
    path = Path(output_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        return RunFile(**json.loads(path.read_text()))
    except (ValueError, TypeError) as err:
        raise HydraliError(
            f"{path} is damaged ({err}): it records the run in this dir; pass another hydra.run.dir"
        ) from err


def write(output_dir: str | os.PathLike, run_file: RunFile) -> None:
    """Write `run_file` as the run's run.json (atomically: a crash leaves the old one or the new one)."""
    write_atomically(
        Path(output_dir) / RUN_FILE, (json.dumps(asdict(run_file), indent=1, sort_keys=True) + "\n").encode()
    )


def absolute(value) -> str | None:
    """The location `value` made absolute against the current directory (a SQLite store's file too)."""
    if value is None or value == "":
        return None
    text = str(value)
    if text.startswith(_SQLITE):
        return _SQLITE + str(Path(text[len(_SQLITE) :]).expanduser().resolve())
    if "://" in text:  # a server's URL, an object store: already absolute
        return text
    return str(Path(text).expanduser().resolve())


def locations(cfg: DictConfig) -> dict[str, str | None]:
    """The run's locations (LOCATION_KEYS present in `cfg`), absolute."""
    found = {}
    for key in LOCATION_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if OmegaConf.select(cfg, key, default="<absent>") != "<absent>":
            found[key] = absolute(value)
    return found


def resolved(cfg: DictConfig) -> dict:
    """`cfg` resolved to plain data, its locations absolute (what run.json keeps and a new attempt is compared to)."""
    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    tree = OmegaConf.create(plain)
    for key, value in locations(cfg).items():
        OmegaConf.update(tree, key, value, merge=False)
    return OmegaConf.to_container(tree)


def run_file_of(
    cfg: DictConfig, overrides: list[str], mlflow_run_id: str | None, decided: dict | None = None
) -> RunFile:
    """The run.json of a run of `cfg` composed from `overrides`; `decided`: what the attempt decided by itself."""
    return RunFile(
        overrides=list(overrides),
        config=resolved(cfg),
        locations=locations(cfg),
        mlflow_run_id=mlflow_run_id,
        decided=dict(decided or {}),
    )


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): node}


def differences(then: dict, now: dict, ignored: tuple[str, ...] = (), shown: int = _SHOWN_DIFFERENCES) -> str:
    """The keys (dotted) whose values differ between two nested dicts, but `ignored` ones and those under them, in
    words (`a.b is 1 there, 2 here; ...`, the first `shown` of them); empty when none differ. `then`, a record,
    holds the keys added since it was written (registry.added_keys) at the value they had then, where `now` has
    them."""
    flat_then, flat_now = _flat(then), _flat(now)
    task = flat_now.get("task.name", flat_then.get("task.name"))
    backend = flat_now.get("backend.name", flat_then.get("backend.name"))
    added = added_keys(task, backend).items()
    flat_then.update({key: value for key, value in added if key in flat_now and key not in flat_then})
    under = tuple(k + "." for k in ignored)
    differ = [
        key
        for key in sorted(set(flat_then) | set(flat_now))
        if flat_then.get(key) != flat_now.get(key) and key not in ignored and not key.startswith(under)
    ]
    words = "; ".join(f"{key} is {flat_then.get(key)!r} there, {flat_now.get(key)!r} here" for key in differ[:shown])
    return words + (f" (and {len(differ) - shown} more)" if len(differ) > shown else "")


def not_compared() -> tuple[str, ...]:
    """The keys whose values may differ between the attempts of one run: ckpt_path and the output dir (by design),
    the run policies, and the keys an earlier release had whose job a core key does now (replaced_keys)."""
    return NOT_COMPARED + RUN_POLICIES + tuple(replaced_keys())


def refuse_other_config(output_dir: Path, run_file: RunFile, cfg: DictConfig) -> None:
    """Refuse, in one line naming the differing keys, a new run of another config in a used run dir."""
    differ = differences(run_file.config, resolved(cfg), ignored=not_compared())
    if differ:
        raise HydraliError(
            f"hydra.run.dir={output_dir} holds a run with other settings ({differ}): pass a new hydra.run.dir "
            f"for a new run, or ckpt_path=last to resume that run as it was"
        )


def override_key(override: str) -> str:
    """The key or config group an override sets (`optim.lr=0.1` -> optim.lr, `+x=1` -> x, `optim=adamw` -> optim)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(override).key_or_group


def set_on_command_line(key: str, overrides: list[str]) -> bool:
    """Whether `overrides` set `key` (dotted), or a node holding it (pipeline.options={...}); choosing a config group
    (data=imagefolder) sets none of its keys."""
    return any(key == set_ or ("." in set_ and key.startswith(f"{set_}.")) for set_ in map(override_key, overrides))


def merge_overrides(then: list[str], now: list[str]) -> list[str]:
    """The overrides of a run composed again: `then`'s, but for the keys `now` sets and those of an earlier release
    that a core key replaced (left out, in a warning naming the key that does their job), followed by `now`."""
    keys_now, replaced = {override_key(o) for o in now}, replaced_keys()
    for override in then:
        if override_key(override) in replaced:
            log.warning(
                "the run's %s is left out: %s does its job now (the same key on every backend; its default unless "
                "given)",
                override,
                replaced[override_key(override)],
            )
    return [o for o in then if override_key(o) not in keys_now and override_key(o) not in replaced] + list(now)


def compose_again(overrides: list[str]) -> DictConfig:
    """The config that `hydrali <overrides>` composes (Hydra's compose API: within the running app, or alone)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose(config_name="config", overrides=overrides)
    with initialize_config_module(config_module="hydrali.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def pin_locations(cfg: DictConfig, run_file: RunFile, overrides: list[str], output_dir: Path) -> None:
    """Set, in `cfg`, the run's recorded locations (but those `overrides` name) and its dir."""
    named = {override_key(o) for o in overrides}
    for key, value in run_file.locations.items():
        if key not in named and OmegaConf.select(cfg, key, default="<absent>") != "<absent>":
            OmegaConf.update(cfg, key, value, merge=False)
    cfg.paths.output_dir = str(output_dir)


@dataclass(frozen=True)
class Attempt:
    """What one attempt runs in a run dir."""

    cfg: DictConfig  # its config
    overrides: list[str]  # the overrides that config is composed from
    run_file: RunFile | None  # the dir's run file before it (None: a new run dir)


def reconcile(cfg: DictConfig, output_dir: Path, overrides: list[str]) -> Attempt:
    """What this attempt runs in `output_dir`: in a new dir, `cfg` as it is; with `ckpt_path` set, the recorded
    run's config with this command's `overrides` on top; without, `cfg` if it equals the recorded one (the runner
    then resumes from the newest checkpoint, if any), else refused in one line. Recorded locations are pinned."""
    run_file = read(output_dir)
    if run_file is None:
        return Attempt(cfg, list(overrides), None)
    if cfg.ckpt_path is not None:
        merged = merge_overrides(run_file.overrides, overrides)
        again = compose_again(merged)
        pin_locations(again, run_file, overrides, output_dir)
        return Attempt(again, merged, run_file)
    pin_locations(cfg, run_file, overrides, output_dir)
    refuse_other_config(output_dir, run_file, cfg)
    return Attempt(cfg, list(overrides), run_file)


_CLAIM_TRIES = 20  # a lock held for a moment (a refused attempt removing the empty dir it made) is waited for
_CLAIM_WAIT_S = 0.05


def _lock(fd: int) -> bool:
    """Take the exclusive lock on `fd` without waiting; False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return False
    return True


def open_locked(output_dir: Path) -> int | None:
    """A descriptor of `output_dir` (made if missing) holding its lock, or None when another process holds it.
    The lock is on the dir now at that path: one removed and made again meanwhile is opened again."""
    for _ in range(_CLAIM_TRIES):
        output_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # removed between the two calls
            continue
        if not _lock(fd):
            os.close(fd)
            time.sleep(_CLAIM_WAIT_S)
            continue
        try:
            same = os.stat(output_dir).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the dir locked was removed by the process that held it: take the new one
    return None


def new_timed_dir(base: str, key: str) -> str:
    """`base`, or `base_2`, `base_3`, ...: the first that this process makes (made atomically: two processes never
    get one). `key` names the setting to pass instead when every one is taken."""
    for n in range(1, MAX_SAME_SECOND + 1):
        candidate = base if n == 1 else f"{base}_{n}"
        try:
            Path(base).parent.mkdir(parents=True, exist_ok=True)  # again: a refused run may have removed it
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise HydraliError(f"{MAX_SAME_SECOND} started in one second under {base}: pass {key}")


@contextlib.contextmanager
def claim(output_dir: Path, hold: bool = True):
    """Hold the run dir's lock while the block runs (`hold` false: a process of a job whose own process holds it);
    refused in one line when another process holds it."""
    if not hold:
        yield
        return
    fd = open_locked(Path(output_dir))
    if fd is None:
        raise HydraliError(
            f"hydra.run.dir={output_dir} is in use: another hydrali process is running in it; wait for it to "
            f"end (then ckpt_path=last resumes it if it was interrupted), or pass another hydra.run.dir"
        )
    try:
        with live_processes.holding(output_dir, fd):  # the job's processes hold it too, while any lives
            yield
    finally:
        os.close(fd)  # releases the lock (as any exit of the process does), once no process of the job holds it


def remove_if_empty(output_dir: str | os.PathLike) -> None:
    """Remove a run dir that a refused attempt left empty, unless another process holds it (it may have made the
    dir, and is about to write into it); then the empty folders above it that Hydra's default layout made for it
    (_remove_empty_parents)."""
    path = Path(output_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        if _lock(fd) and os.stat(path).st_ino == os.fstat(fd).st_ino and not any(path.iterdir()):
            path.rmdir()  # while locked: a process waiting for the lock sees the dir gone and makes its own
            _remove_empty_parents(path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def note_launch_folders() -> None:
    """Note, before Hydra makes the run dir, which of the launch root's outputs/ and multirun/ exist already: a
    refused attempt removes only what it made (call once at the start of the command)."""
    root = _launch_root()
    _launch_folders["root"] = root
    _launch_folders["existed"] = {name for name in HYDRA_FOLDERS if (root / name).exists()}


def _launch_root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or os.getcwd()).resolve()


def _remove_empty_parents(path: Path) -> None:
    """Remove the empty folders above `path` that Hydra's default layout made for it (outputs/<date>/, and outputs/
    itself when this command made it; the same under multirun/), nearest first, stopping at the first that holds
    anything. Folders of a hydra.run.dir elsewhere are the user's: kept."""
    root = _launch_folders.get("root") or _launch_root()
    existed = _launch_folders.get("existed", set(HYDRA_FOLDERS))
    for parent in path.resolve().parents:
        if not _made_for_runs(parent, root, existed):
            return
        try:
            parent.rmdir()  # fails unless empty: what another process put there stays
        except OSError:
            return


def _made_for_runs(folder: Path, root: Path, existed: set[str]) -> bool:
    """Whether `folder` is of Hydra's default layout under `root`: inside outputs/ or multirun/ (a date folder), or
    one of those two when this command made it (not in `existed`)."""
    for name in HYDRA_FOLDERS:
        if folder == root / name:
            return name not in existed
        if folder.is_relative_to(root / name):
            return True
    return False
