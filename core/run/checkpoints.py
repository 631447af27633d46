"""Which checkpoint a run resumes from (`ckpt_path`), decided the same way for every backend.

`ckpt_path=null` starts fresh; `last` takes the newest checkpoint in this run's `checkpoints/`;
a path must be an existing file of this backend's format. Refused, each in one line, before anything
is written or tracked: a file of another backend (naming the backend that can resume it), a file the
backend cannot read, a checkpoint that already holds every epoch asked for (the same command again on a finished
run is answered before this, from its summary.json: core/run/finished.py), and one written by a run of another
task, model, number of classes or optimizer (`trained_with.json`, which every run writes beside its checkpoints).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Callable

from hydrali.core.contracts.registry import backend_of_checkpoint, backend_spec
from hydrali.core.contracts.task import STARTING_POINT_KEYS
from hydrali.core.errors import HydraliError
from hydrali.core.run.run_dir import differences

CHECKPOINT_DIR = "checkpoints"
TRAINED_WITH = "trained_with.json"  # beside the checkpoints: what decides the shapes of the weights they hold
LATER_KEYS = ("classes",)  # keys of trained_with.json that records written before them lack (compared when present)


def resolve_checkpoint(
    ckpt_path: str | None,
    output_dir: Path,
    backend: str,
    newest: Callable[[Path], Path | None],
    epochs_in: Callable[[Path], int],
    epochs: int,
    trained_with: dict,
) -> tuple[Path, int] | None:
    """The checkpoint to resume from and the whole epochs it holds, or None. `newest(dir)` is the backend's newest
    checkpoint in a dir; `epochs_in(path)` the epochs a file of the backend's format holds (a HydraliError if it
    cannot be read); `trained_with` what this run would write to trained_with.json."""
    if ckpt_path is None:
        return None
    path = _find(ckpt_path, Path(output_dir) / CHECKPOINT_DIR, backend, newest)
    check_readable(path, f"ckpt_path={ckpt_path}")
    done = epochs_in(path)
    if done >= epochs:
        raise HydraliError(
            f"ckpt_path={ckpt_path}: {path} holds {done} trained epochs and the run asks for "
            f"epochs={epochs}, so there is nothing left to train: pass ckpt_path=last epochs=<more than {done}> "
            f"to train on, or a new hydra.run.dir for a new run"
        )
    _check_trained_with(ckpt_path, path.parent / TRAINED_WITH, trained_with)
    return path, done


def _zip_damage(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path):
            return None
    except (zipfile.BadZipFile, OSError) as err:
        return f"a zip archive cut short or damaged: {err}"


def _hdf5_damage(path: Path) -> str | None:
    try:
        import h5py  # installed beside the frameworks that write HDF5; without it the backend's loader judges the file
    except ImportError:
        return None
    try:
        with h5py.File(path, "r"):
            return None
    except OSError as err:
        return f"an HDF5 file cut short or damaged: {str(err).splitlines()[0]}"


# the file containers that checkpoints are written as (zip archives, HDF5 files): how each begins, and its check
CONTAINERS: dict[str, tuple[bytes, Callable[[Path], str | None]]] = {
    "zip": (b"PK\x03\x04", _zip_damage),
    "hdf5": (b"\x89HDF\r\n\x1a\n", _hdf5_damage),
}


def _damage(path: Path) -> str | None:
    """What makes the checkpoint file `path` unreadable (empty, or a container of CONTAINERS cut short or damaged),
    or None when its container reads (its contents are the backend's to judge)."""
    with open(path, "rb") as file:
        head = file.read(8)
    if not head:
        return "it is empty"
    for signature, damage in CONTAINERS.values():
        if head.startswith(signature):
            return damage(path)
    return None  # another container (an older framework's format): the backend's loader judges it


def check_readable(path: Path, setting: str) -> None:
    """One line of its own when the checkpoint file that `setting` names cannot be read (empty, truncated, damaged),
    before the backend's loader meets it."""
    damage = _damage(Path(path))
    if damage is not None:
        raise HydraliError(
            f"{setting}: {path} cannot be read as a checkpoint ({damage}): pass another checkpoint, or train again"
        )


def write_trained_with(output_dir: Path, trained_with: dict) -> None:
    """Record, beside this run's checkpoints, what their weights were trained with (checked on resume)."""
    folder = Path(output_dir) / CHECKPOINT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRAINED_WITH).write_text(json.dumps(trained_with, indent=1, sort_keys=True))


def _check_trained_with(ckpt_path: str, recorded: Path, trained_with: dict) -> None:
    if not recorded.is_file():
        return  # a checkpoint from elsewhere: the backend's loader is the judge
    # where a network's first weights came from (model.weights, model.pretrained) decides no shape, and a relative
    # model.weights is recorded as typed but pinned absolute when the run is resumed
    starting_point = tuple(f"model.{key}" for key in STARTING_POINT_KEYS)
    then = json.loads(recorded.read_text())
    unrecorded = tuple(key for key in LATER_KEYS if key not in then)  # a record older than these keys
    what = differences(then, json.loads(json.dumps(trained_with)), ignored=starting_point + unrecorded, shown=3)
    if what:
        raise HydraliError(
            f"ckpt_path={ckpt_path} was trained with other settings ({what}): resume with the "
            f"settings of that run (its .hydra/config.yaml), or a new hydra.run.dir for a new run"
        )


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def _find(ckpt_path: str, checkpoint_dir: Path, backend: str, newest: Callable[[Path], Path | None]) -> Path:
    suffix = backend_spec(backend).checkpoint_suffix
    if ckpt_path == "last":
        found = newest(checkpoint_dir)
        others = sorted({b for f in _files(checkpoint_dir) if (b := backend_of_checkpoint(f)) not in (None, backend)})
        if found is None and others:
            raise HydraliError(
                f"ckpt_path=last but {checkpoint_dir} holds {' and '.join(others)} checkpoints, not {backend} ones: "
                f"resume that run with backend={others[0]}"
            )
        if found is None:
            raise HydraliError(
                f"ckpt_path=last but {checkpoint_dir} holds no {backend} checkpoint: pass "
                f"hydra.run.dir=<the interrupted run's output dir> or ckpt_path=<a {suffix} file>"
            )
        return found
    path = Path(ckpt_path)
    if not path.is_file():
        raise HydraliError(f"ckpt_path={ckpt_path} is not a file: pass an existing {suffix} file or ckpt_path=last")
    owner = backend_of_checkpoint(path)
    if owner != backend:
        what = (
            f"a checkpoint of backend={owner}: a checkpoint of another backend cannot be resumed here; "
            f"resume it with backend={owner}"
            if owner
            else f"not a {backend} checkpoint ({suffix})"
        )
        raise HydraliError(f"ckpt_path={ckpt_path} is {what}")
    return path
