"""A run whose dir is named by the time it started (the default `outputs/<date>/<time>`) gets a dir of its own: a
second run started in the same second (a script, two terminals) gets `<time>_2`, as a second sweep does
(hydrali.core.run.sweep_dir). A dir the user names (`hydra.run.dir=...`, even one with `${now:...}` in it) is taken as
named: the same command there resumes or reports its run, and another process running in it is refused
(hydrali.core.run.run_dir.claim). Processes a launcher started (torchrun, srun, mpirun) keep Hydra's dir: the job's
ranks agree on rank 0's (hydrali.core.distributed.agreement)."""

from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write

from hydrali.core.errors import EXIT_USER_ERROR, HydraliError


def claim_timed_run_dir(config: DictConfig) -> str | None:
    """Make the run dir of `config` (a single run's config, before Hydra makes its dir) this process's own when its
    name comes from the time (the config's default, not a hydra.run.dir override), and make the run use it; return it
    (None: a named dir, or a process a launcher started)."""
    from hydrali.core.distributed import topology
    from hydrali.core.run.run_dir import TIMED, new_timed_dir, override_key

    raw = str(OmegaConf.to_container(config.hydra.run, resolve=False)["dir"])
    named = any(override_key(str(o)) == "hydra.run.dir" for o in config.hydra.overrides.hydra)
    # a launcher's processes (torchrun, srun, mpirun) each compose the time: rank 0's dir is agreed on later
    if TIMED not in raw or named or topology.launched_externally():
        return None
    folder = new_timed_dir(str(config.hydra.run.dir), "hydra.run.dir")
    with read_write(config.hydra.run):
        config.hydra.run.dir = folder  # Hydra's run_job makes and logs into this one
    return folder


class ClaimTimedRunDir(Callback):
    """Before a single run's dir is made: a dir named by the time is made new for this process
    (claim_timed_run_dir)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Give the run a dir of its own when its name comes from the time."""
        try:
            claim_timed_run_dir(config)
        except HydraliError as err:  # Hydra turns a callback's exception into a warning: the run ends here
            print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_USER_ERROR) from err
