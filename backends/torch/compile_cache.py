"""torch.compile's compiled code kept between runs (backend.compile_cache): Inductor's caches, which a later run, or a
later job of a sweep, reads instead of compiling again.

torch.compile keeps three caches on disk, all under Inductor's cache folder (TORCHINDUCTOR_CACHE_DIR; torch's default
is a folder in /tmp that a reboot or another machine does not keep): Inductor's FX graph cache (the generated code of
each graph), AOTAutograd's cache (the forward and backward graphs it derives from one traced graph) and Triton's
kernels (under <folder>/triton). hydrali points that folder at <backend.compile_cache>/torch, so the jobs of a sweep
and later runs share one.

What the keys hold, which is why a hit is safe: Inductor's key is a hash of the graph's code, the shapes, strides,
dtypes and devices of its inputs, Inductor's and Dynamo's settings, torch's version and a hash of its source, the
GPU's name and properties and Triton's version; AOTAutograd's adds its own settings and the graph's autograd state.
Any difference is another entry, never a wrong one: another network, batch, image size, precision or compile mode
compiles anew; another lr or weight decay does not change the graph (the optimizer runs outside it). Entries are
written whole (a temporary file renamed), so several jobs can write at once. What is not kept is Dynamo's trace of
the Python code, which every run redoes (seconds): the graphs it finds are then the kept ones.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("hydrali")

FOLDER_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"  # torch's: Inductor's cache folder (Triton's kernels under it)
OWNER_VARIABLE = "HYDRALI_TORCH_CACHE_FOLDER"  # the folder hydrali put in TORCHINDUCTOR_CACHE_DIR (children inherit)
SUBFOLDER = "torch"  # under backend.compile_cache


def use_kept_compiles(cache_folder: str | None) -> Path | None:
    """Make this process's torch.compile read and keep its compiled code under `cache_folder`/torch (call before the
    first compiled step); return that folder. None: torch's default folder, or the one TORCHINDUCTOR_CACHE_DIR names
    where the user set it (theirs is used, and None returned)."""
    if cache_folder is None:
        return None
    named = os.environ.get(FOLDER_VARIABLE)
    if named is not None and named != os.environ.get(OWNER_VARIABLE) and named != _torch_default():
        log.info("backend.compile_cache: TORCHINDUCTOR_CACHE_DIR names a cache already (%s); that one is used", named)
        return None
    folder = (Path(cache_folder) / SUBFOLDER).absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log.warning(
            "backend.compile_cache: cannot keep compiled code in %s (%s): set it to a writable folder, or null",
            folder,
            err,
        )
        return None
    os.environ[FOLDER_VARIABLE] = os.environ[OWNER_VARIABLE] = str(folder)
    return folder


def _torch_default() -> str:
    """The folder torch uses (and writes into TORCHINDUCTOR_CACHE_DIR) where none is named: a process that compiled
    with compile_cache=null before holds it, which is not the user's choice."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())
