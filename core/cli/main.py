"""The `hydrali` command (also `python -m hydrali.core`): Hydra composes the config, hydrali.core.run.runner runs it."""

from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from hydrali.core.cli.exit_codes import EXIT_FAILED_SWEEP, EXIT_INTERRUPTED, EXIT_SIGNAL_BASE, EXIT_USER_ERROR
from hydrali.core.cli.sweep_launcher import register as register_launcher
from hydrali.core.cli.use import COMMANDS
from hydrali.core.config.store import register_schemas
from hydrali.core.errors import HydraliError
from hydrali.core.process import collector
from hydrali.core.run.run_dir import note_launch_folders, remove_if_empty
from hydrali.core.run.wall_time import counted_from_process_start

log = logging.getLogger("hydrali")
# Hydra re-raises composition errors (instead of printing them over many lines and exiting 1) when
# HYDRA_FULL_ERROR=1; hydrali sets it to print them as one line, and marks that it did so.
_FULL_ERROR, _SET_BY_HYDRALI = "HYDRA_FULL_ERROR", "HYDRALI_SET_HYDRA_FULL_ERROR"
_job = {"started": False}  # whether a job started in this process


@hydra.main(config_path="pkg://hydrali.conf", config_name="config", version_base="1.3")
def _hydra_entry(cfg: DictConfig) -> float | None:
    from hydrali.core.process.preemption import Preempted
    from hydrali.core.run.runner import run  # imported here so that `--help` and `--cfg` stay fast
    from hydrali.core.tracking import sweep

    _job["started"] = True
    try:
        if sweep.current_job() is not None:  # under -m a failed job is recorded and the sweep goes on
            return sweep.run_job(cfg, run)
        return run(cfg)
    except HydraliError as err:
        print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
        remove_if_empty(cfg.paths.output_dir)  # a refused attempt leaves no trace
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt:
        print(
            f"hydrali: interrupted: the run is marked KILLED; resume it with ckpt_path=last "
            f"hydra.run.dir={cfg.paths.output_dir}",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(EXIT_INTERRUPTED)
    except Preempted as stop:
        print(
            f"hydrali: preempted by {stop}: the run is marked KILLED; the same command with "
            f"hydra.run.dir={cfg.paths.output_dir} resumes it there (a requeued SLURM job does)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(EXIT_SIGNAL_BASE + stop.signum)


def _close_stopped_sweep(status: str) -> None:
    """Hydra ends a sweep that a job or the sweeper stopped without its callbacks: close its parent run here,
    with its jobs still running, as `status` (KILLED on Ctrl+C, FAILED otherwise)."""
    from hydrali.core.tracking.sweep_callback import open_sweep_store

    store = open_sweep_store()
    if store is None:
        return
    from hydrali.core.tracking.sweep_report import close_sweep

    try:
        close_sweep(store, status=status)
    except Exception as err:  # noqa: BLE001 - the store's trouble must not hide why the sweep stopped
        print(f"hydrali: warning: the sweep's parent MLflow run could not be closed: {err}", file=sys.stderr)


def _exit_if_a_job_failed() -> None:
    """A sweep with a failed job exits with EXIT_FAILED_SWEEP once its other jobs ended (its table, printed above,
    holds each job's error)."""
    from hydrali.core.tracking.sweep_callback import failed_jobs

    failed = failed_jobs()
    if failed:
        print(
            f"hydrali: error: {failed} job(s) of the sweep failed (the table above gives each job's error)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(EXIT_FAILED_SWEEP)


def _serve_ui(overrides: list[str]) -> None:
    """`hydrali ui [overrides]`: MLflow's UI over the configured store; mistakes end in one line."""
    from hydrali.core.cli.ui import USAGE, serve

    if any(a in ("-h", "--help") for a in overrides):
        print(USAGE)
        sys.exit(0)
    try:
        code = serve(overrides)
    except HydraliError as err:
        print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    except Exception as err:  # a composition error (an unknown key, a bad value)
        from hydrali.core.cli.config_errors import composition_error_line

        print(f"hydrali: error: {composition_error_line(err, overrides)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    sys.exit(code)  # the server's own exit code when it ended by itself


def main() -> None:
    """Run hydrali from the command line (the `hydrali` console script); `hydrali ui` browses the runs;
    `hydrali eval|predict|export RUN_DIR` use a trained run; `hydrali convert` shards a dataset."""
    trains = sys.argv[1:2] != ["ui"] and not (sys.argv[1:2] and sys.argv[1] in COMMANDS)
    with collector.command_process(paused_until_loaded=trains):  # a training run's imports walked once
        _main()


def _main() -> None:
    """main's work, in its collector policy."""
    from hydrali.core.cli.user_paths import expand_home

    sys.argv[1:] = expand_home(sys.argv[1:])  # data.root=~/photos: no shell expands that `~`
    try:
        register_schemas()  # reads the registry: a broken plug-in ends here in one line
        register_launcher()  # hydra/launcher=hydrali, the default of -m
    except HydraliError as err:
        print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    if sys.argv[1:2] == ["ui"]:
        _serve_ui(sys.argv[2:])
    if sys.argv[1:2] and sys.argv[1] in COMMANDS:  # eval | predict | export RUN_DIR [key=value ...]
        from hydrali.core.cli.use import run_command

        run_command(sys.argv[1], sys.argv[2:])
    note_launch_folders()  # before Hydra makes the run dir: a refused attempt removes only what it made
    wants_trace = os.environ.get(_FULL_ERROR) == "1" and _SET_BY_HYDRALI not in os.environ
    os.environ[_FULL_ERROR] = os.environ[_SET_BY_HYDRALI] = "1"
    try:
        with counted_from_process_start():  # a run's wall time counts from this process's start
            _hydra_entry()
        _exit_if_a_job_failed()
    except (KeyboardInterrupt, SystemExit) as stop:
        preempted = isinstance(stop, SystemExit) and isinstance(stop.code, int) and stop.code > EXIT_SIGNAL_BASE
        interrupted = isinstance(stop, KeyboardInterrupt) or stop.code == EXIT_INTERRUPTED or preempted
        if not (isinstance(stop, SystemExit) and stop.code in (0, None)):
            _close_stopped_sweep("KILLED" if interrupted else "FAILED")
        if isinstance(stop, KeyboardInterrupt):
            print("hydrali: interrupted", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)
        raise
    except Exception as err:
        _close_stopped_sweep("FAILED")
        from hydrali.core.tracking.sweep_callback import sweep_started

        if _job["started"] or sweep_started() or wants_trace:  # a failure while running, or a user asking
            raise  #   for Hydra's trace
        from hydrali.core.cli.config_errors import composition_error_line

        print(f"hydrali: error: {composition_error_line(err, sys.argv[1:])}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
