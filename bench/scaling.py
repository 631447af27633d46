"""Section 6 of hydrali-bench: how a backend's images/s grows from one GPU to several.

Each measurement is one whole `hydrali` run in a process of its own (as a user starts it; Lightning then starts
one process per GPU, Keras drives every GPU from its one process), and its figure is the run's steady-state
images/s from its summary.json (each epoch's first `throughput_warmup_steps` steps left out, hence compilation
too). Runs on 1 GPU and on N are interleaved and repeated like every other measurement of the benchmark; a row on
N GPUs names the same settings' 1-GPU row as its baseline, so the table's ratio is the scaling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hydrali.bench.timing import Timing
from hydrali.core.errors import HydraliError

LIBRARY_PATH = "LD_LIBRARY_PATH"
SUMMARY = "summary.json"


def device_counts(requested: list[int], visible_gpus: int) -> list[int]:
    """The GPU counts a scaling row set trains on: 1 and `requested` (1 first, each once, in order), or 1 and every
    visible GPU when nothing is requested."""
    counts = [1, *(requested or ([visible_gpus] if visible_gpus > 1 else []))]
    return sorted(set(counts))


def environment(library_path: str | None) -> dict:
    """A run's environment: this process's, `library_path` first on LD_LIBRARY_PATH when given."""
    env = dict(os.environ)
    if library_path:
        env[LIBRARY_PATH] = os.pathsep.join(p for p in (library_path, env.get(LIBRARY_PATH)) if p)
    return env


class ScalingRun:
    """One `hydrali` command on `devices` devices; once() = one run, its steady images/s (summary.json)."""

    def __init__(self, overrides: list[str], devices: int, run_dir: Path, library_path: str | None = None):
        self.overrides, self.devices, self.run_dir = list(overrides), int(devices), Path(run_dir)
        self.library_path = library_path  # put first on LD_LIBRARY_PATH (TensorFlow's CUDA libraries), or None
        self.repeat = 0
        self.summaries: list[dict] = []  # every repeat's summary.json, in order

    def command(self, output_dir: Path) -> list[str]:
        """The command line of one run into `output_dir`."""
        return [
            sys.executable,
            "-m",
            "hydrali.core",
            *self.overrides,
            f"backend.devices={self.devices}",
            f"hydra.run.dir={output_dir}",
        ]

    def environment(self) -> dict:
        """The run's environment: this process's, `library_path` first on LD_LIBRARY_PATH when given."""
        return environment(self.library_path)

    def once(self) -> Timing:
        """Run the command once in a new run dir; its steady-state images/s (all devices together)."""
        self.repeat += 1
        while (self.run_dir / f"r{self.repeat}").exists():  # a benchmark run again in the same dir: new runs
            self.repeat += 1
        output_dir = self.run_dir / f"r{self.repeat}"
        done = subprocess.run(self.command(output_dir), env=self.environment(), capture_output=True, text=True)
        summary_file = output_dir / SUMMARY
        if done.returncode != 0 or not summary_file.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise HydraliError(
                f"`hydrali {' '.join(self.command(output_dir)[3:])}` failed ({done.returncode}): {tail[0]}"
            )
        summary = json.loads(summary_file.read_text())
        self.summaries.append(summary)
        rate = summary.get("steady_images_per_second")
        if not rate:
            raise HydraliError(
                f"{summary_file} has no steady-state images/s: give each epoch more than "
                f"throughput_warmup_steps steps (more images, or fewer devices)"
            )
        if summary.get("world_size") != self.devices:
            raise HydraliError(
                f"{summary_file}: the run trained on {summary.get('world_size')} devices, not {self.devices}"
            )
        return Timing(float(rate))
