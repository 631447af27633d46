"""Every job of a sweep composed and checked as a single run is, before the sweep writes anything.

Hydra composes a sweep's jobs only once its dir and multirun.yaml are written, and reports a job it cannot compose
with its whole trace; a typo in one value (`optim.lrr=0.1,0.2`, `backend=lightning,kears`, `epochs=abc,1`) then
leaves a sweep dir behind. Here each job's overrides are composed by Hydra's own config loader (as its launcher
composes them) and checked by hydrali's config checks (core/config/validate.py), in the process that launches the
sweep, before its dir is claimed: the first mistake is the one line a single run with that override prints.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hydrali.core.errors import EXIT_USER_ERROR, HydraliError

MAX_COMBINATIONS = 256  # more jobs than this: each value of each swept key is composed once, not every combination


def _values(override) -> list[str]:
    """The values of one override as a job receives them (`key=value` strings): every value of a choice, a range
    or a glob; both ends of an interval (a search draws between them); the override itself when it sweeps nothing."""
    from hydra.core.override_parser.types import IntervalSweep

    if not override.is_sweep_override():
        return [override.input_line]
    key = override.get_key_element()
    value = override.value()
    if isinstance(value, IntervalSweep):
        return [f"{key}={value.start}", f"{key}={value.end}"]
    return [f"{key}={item}" for item in override.sweep_string_iterator()]


def job_overrides(arguments: list[str]) -> list[list[str]]:
    """The overrides of the jobs that check every value of `arguments` (a sweep's overrides): every combination, as
    Hydra's grid sweeper runs them, up to MAX_COMBINATIONS; past that, as many jobs as the longest list of values,
    job i taking value i (or the last) of each key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(arguments)
    lists = [_values(override) for override in parsed]
    count = 1
    for values in lists:
        count *= len(values)
    if count <= MAX_COMBINATIONS:
        return [list(job) for job in itertools.product(*lists)]
    longest = max(len(values) for values in lists)
    return [[values[min(i, len(values) - 1)] for values in lists] for i in range(longest)]


def sweep_arguments(config: DictConfig) -> list[str]:
    """The overrides a sweep's jobs are made from: the sweeper's `params` in the config, then the command line's."""
    params = OmegaConf.select(config, "hydra.sweeper.params")
    from_config = [f"{key}={value}" for key, value in params.items()] if isinstance(params, DictConfig) else []
    return from_config + list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))


def check_sweeper(config: DictConfig) -> None:
    """The sweeper's own settings that cannot work here: an Optuna storage (hydra.sweeper.storage). The Optuna
    sweeper's optuna 2.10 cannot open an RDB storage with SQLAlchemy 2 (its `version is not None` assertion; optuna
    issues #4375, #4392): a traceback after the sweep's MLflow store, dir and database file were written."""
    storage = OmegaConf.select(config, "hydra.sweeper.storage", default=None)
    if storage is not None:
        raise HydraliError(
            f"hydra.sweeper.storage={storage}: the Optuna sweeper's optuna 2.10 cannot open a storage beside "
            "SQLAlchemy 2: leave it null (the study lives in memory and every trial's run is in MLflow; the same "
            "command started again in the sweep's dir proposes the same trials from hydra.sweeper.sampler.seed)"
        )


def check_sweep_jobs(config: DictConfig) -> None:
    """Compose and check each job of the sweep `config` launches; raise HydraliError with the single run's one line
    for the first that fails."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from hydrali.core.cli.config_errors import composition_error_line
    from hydrali.core.config.validate import check_config

    loader = GlobalHydra.instance().config_loader()
    launcher_config = HydraConfig.instance().cfg  # set back after each job, as Hydra's run_job does
    try:
        for number, overrides in enumerate(job_overrides(sweep_arguments(config))):
            try:
                job = loader.load_sweep_config(config, overrides)
            except Exception as err:  # Hydra's composition errors, of several types
                raise HydraliError(composition_error_line(err, overrides)) from err
            with open_dict(job):  # as Hydra's launcher numbers the job and names its dir (hydra/core/utils.py)
                job.hydra.job.id = job.hydra.job.num = number
            HydraConfig.instance().set_config(job)
            subdir = OmegaConf.select(job, "hydra.sweep.subdir")
            with read_write(job.hydra.runtime), open_dict(job.hydra.runtime):
                job.hydra.runtime.output_dir = str(Path(str(job.hydra.sweep.dir)) / str(subdir))
            HydraConfig.instance().set_config(job)
            with read_write(job), open_dict(job):  # the job's function receives its config without hydra's node
                del job["hydra"]
            check_config(job)
    finally:
        if launcher_config is not None:
            HydraConfig.instance().set_config(launcher_config)


def check_launcher(config: DictConfig) -> None:
    """hydrali's launcher's settings (hydra.launcher.gpus, gpus_per_job, the jobs' backend.devices): GPU ids that
    are not distinct, a size below one GPU; one line before anything is written."""
    from hydrali.core.cli.sweep_launcher import HydraliLauncher, job_gpus
    from hydrali.core.distributed.gpu_placement import count_gpus, plan, visible_gpus

    launcher = OmegaConf.select(config, "hydra.launcher", default=None)
    if launcher is None or not str(launcher.get("_target_", "")).endswith(f".{HydraliLauncher.__name__}"):
        return
    per_job = job_gpus(config, job_overrides(sweep_arguments(config)), int(launcher.get("gpus_per_job", 1)))
    plan(visible_gpus(launcher.get("gpus"), count_gpus), per_job)


class CheckSweepJobs(Callback):
    """Under -m, before any other callback claims the sweep's dir: every job checked (check_sweep_jobs); the first
    mistake ends the sweep in one line with exit 2."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check every job of the sweep `config` launches, or end the command with the first one's error."""
        try:
            check_sweeper(config)
            check_sweep_jobs(config)
            check_launcher(config)
        except HydraliError as err:  # Hydra turns a callback's exception into a warning: the sweep ends here
            print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_USER_ERROR) from err
