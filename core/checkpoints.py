"""Which checkpoint a run resumes from (`ckpt_path`), decided the same way for every backend.

`ckpt_path=null` starts fresh; `last` takes the newest checkpoint in this run's `checkpoints/`;
a path must be an existing file of this backend's format. A file of another backend's format is
refused, naming the backend that can resume it. Resolved before anything is written or tracked.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from hydrali.core.errors import HydraliError

CHECKPOINT_DIR = "checkpoints"
SUFFIXES = {"lightning": ".ckpt", "keras": ".weights.h5"}   # the file format of each backend


def backend_of(path: Path) -> str | None:
    """The backend whose checkpoint format `path` has, by its name, or None."""
    for backend, suffix in SUFFIXES.items():
        if path.name.endswith(suffix):
            return backend
    return None


def resolve_checkpoint(ckpt_path: str | None, output_dir: Path, backend: str,
                       newest: Callable[[Path], Path | None],
                       check: Callable[[Path], object] | None = None) -> Path | None:
    """The checkpoint to resume from, or None; `newest(dir)` is the backend's newest checkpoint in a dir, and
    `check(path)` (if given) raises a HydraliError for a file of the backend's format that it cannot resume."""
    if ckpt_path is None:
        return None
    suffix = SUFFIXES[backend]
    checkpoint_dir = Path(output_dir) / CHECKPOINT_DIR
    if ckpt_path == "last":
        found = newest(checkpoint_dir)
        if found is None:
            raise HydraliError(f"ckpt_path=last but {checkpoint_dir} holds no {backend} checkpoint: pass "
                               f"hydra.run.dir=<the interrupted run's output dir> or ckpt_path=<a {suffix} file>")
        return found
    path = Path(ckpt_path)
    if not path.is_file():
        raise HydraliError(f"ckpt_path={ckpt_path} is not a file: pass an existing {suffix} file or ckpt_path=last")
    owner = backend_of(path)
    if owner != backend:
        what = (f"a checkpoint of backend={owner}: a checkpoint of another backend cannot be resumed here; "
                f"resume it with backend={owner}" if owner else f"not a {backend} checkpoint ({suffix})")
        raise HydraliError(f"ckpt_path={ckpt_path} is {what}")
    if check is not None:
        check(path)
    return path
