"""A sweep's dir is its own, as a run dir is: two sweeps never share one.

The process that launches a sweep (-m) claims its dir before anything is written there and holds its lock until it
ends. A dir named by the time (the default `multirun/<date>/<time>`) is made new: a second sweep started in the
same second gets `<time>_2` (and its own MLflow parent run, keyed by the dir). A dir the user names
(`hydra.sweep.dir=...`) is refused in one line while another sweep runs in it, or when it holds another sweep's
`multirun.yaml` (other overrides); the same sweep started again there goes on (its jobs resume in their run dirs).
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hydrali.core.errors import HydraliError
from hydrali.core.run.run_dir import TIMED, new_timed_dir, open_locked

SWEEP_FILE = "multirun.yaml"  # Hydra's record of the sweep's config, in its dir
_held: list[int] = []  # the claimed dirs' locked descriptors, held until the process ends


def _quoted(value: str) -> str:
    """`value` as a quoted value of Hydra's override grammar."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _refuse_another_sweep(folder: Path, config: DictConfig) -> None:
    """Refuse a user-named sweep dir that holds another sweep's record (other overrides)."""
    record = folder / SWEEP_FILE
    if not record.is_file():
        return
    then = list(OmegaConf.load(record).hydra.overrides.task)
    now = list(config.hydra.overrides.task)
    if then != now:
        raise HydraliError(
            f"hydra.sweep.dir={folder} holds another sweep ({' '.join(then) or 'no overrides'}): pass a new "
            f"hydra.sweep.dir"
        )


def claim_sweep_dir(config: DictConfig) -> str:
    """Claim the dir of the sweep `config` (the sweep's config, before its sweeper starts) for this process, and make
    every job use it; return it. Refused in one line (nothing written) when it is another sweep's."""
    raw = str(OmegaConf.to_container(config.hydra.sweep, resolve=False)["dir"])
    named = str(config.hydra.sweep.dir)
    if TIMED in raw:
        folder = new_timed_dir(named, "hydra.sweep.dir")
    else:
        folder = named
    fd = open_locked(Path(folder))
    if fd is None:
        raise HydraliError(
            f"hydra.sweep.dir={folder} is in use: another hydrali sweep is running in it; wait for it to end, or "
            f"pass another hydra.sweep.dir"
        )
    try:
        _refuse_another_sweep(Path(folder), config)
    except HydraliError:
        os.close(fd)
        raise
    _held.append(fd)
    if folder != named:  # the sweeper, the launcher and every job compose their dirs from these
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.sweep.dir = folder
            config.hydra.overrides.hydra.append(f"hydra.sweep.dir={_quoted(folder)}")
    return folder
