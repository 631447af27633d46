"""The `hydrali-bench` command (also `python -m hydrali.bench.cli`): Hydra composes conf/bench.yaml,
hydrali.bench.sections measures, and one table (images/s, ratios against each baseline) is printed last;
the JSON results go to bench.json. Exit codes: 0, 1 when a measurement failed (its row says why), 2 for a
mistake in the command line or the data (one line naming it)."""

from __future__ import annotations

import datetime
import logging
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from hydrali.bench.schema import register_bench_schema
from hydrali.core.config.store import register_schemas
from hydrali.core.errors import HydraliError
from hydrali.core.process import collector

log = logging.getLogger("hydrali")
_started = {"yes": False}  # whether the benchmark itself started (past Hydra's composition)
PACKAGES = (
    "nvidia-dali-cuda120",
    "nvidia-dali-cuda130",
    "torch",
    "lightning",
    "tensorflow",
    "keras",
    "nvidia-dali-tf-plugin-cuda120",
    "hydra-core",
)


def versions() -> dict[str, str]:
    """Python's and the installed packages' versions (those not installed are left out)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def gpu_name() -> str | None:
    """The first GPU's name, as torch reports it (None without one)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def commit() -> str | None:
    """The git commit of hydrali's source, when it runs from a checkout."""
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=Path(__file__).resolve().parent,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def meta(cfg: DictConfig, overrides: list[str], machine) -> dict:
    """What the JSON and BENCHMARKS.md need besides the figures: when, where, with what, how."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "gpu": gpu_name(),
        "cpu_cores": machine.cores,
        "versions": versions(),
        "commit": commit(),
        "command": " ".join(["hydrali-bench", *overrides]),
        "bench": OmegaConf.to_container(cfg.bench, resolve=True, enum_to_str=True),
    }


@hydra.main(config_path="pkg://hydrali.conf", config_name="bench", version_base="1.3")
def _entry(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from hydrali.bench.sections import Bench, detect_machine

    _started["yes"] = True
    overrides = list(HydraConfig.get().overrides.task)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    machine = detect_machine()
    bench = Bench(cfg.bench, overrides, run_dir, machine)
    try:
        report = bench.run()
    except HydraliError as err:
        print(f"hydrali-bench: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    out = Path(cfg.bench.json)
    path = report.write_json(out if out.is_absolute() else run_dir / out, meta(cfg, overrides, machine))
    info = meta(cfg, overrides, machine)
    sections = [str(s) for s in cfg.bench.sections]
    sweep = f" (section 8, sweep: {cfg.bench.sweep.repeats})" if "sweep" in sections else ""
    print(
        f"\nhydrali-bench: {info['date']}, {info['gpu'] or 'no GPU'}, {machine.cores} CPU cores; "
        f"median of {cfg.bench.repeats} interleaved repeats{sweep}; JSON: {path}\n",
        flush=True,
    )
    print(report.table(sections), flush=True)
    if any(r.skipped and r.skipped.startswith("failed") for r in report.rows.values()):
        sys.exit(1)


def main() -> None:
    """Run the benchmark from the command line (the `hydrali-bench` console script)."""
    with collector.command_process(paused_until_loaded=False):  # its exit does not walk the frameworks' objects
        _main()


def _main() -> None:
    """main's work, in its collector policy."""
    try:
        register_schemas()  # reads the registry: a broken plug-in ends here in one line
    except HydraliError as err:
        print(f"hydrali-bench: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    register_bench_schema()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises composition errors; they are printed in one line below
    try:
        _entry()
    except HydraliError as err:
        print(f"hydrali-bench: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except Exception as err:
        if _started["yes"]:
            raise
        from hydrali.core.cli.config_errors import composition_error_line

        print(f"hydrali-bench: error: {composition_error_line(err, sys.argv[1:])}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
