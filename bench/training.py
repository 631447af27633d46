"""A training run through hydrali itself (core.run.runner.run, the configured backend), timed over steps.

Each repeat is one whole run, in a run dir of its own under the benchmark's, with a step timer added to
`backend.callbacks` (bench/torch_loops.py or bench/keras_loops.py). The timer measures `warmup + steps`
steps of the first epoch and then stops training, so that start-up, tracing, validation and checkpoints
are outside the timed window; the run's own images/s (its summary.json) is not used.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf, open_dict

from hydrali.bench.timing import STEP_WINDOWS
from hydrali.core.errors import HydraliError

TIMERS = {
    "lightning": "hydrali.bench.torch_loops.LightningStepTimer",
    "keras": "hydrali.bench.keras_loops.KerasStepTimer",
}


class HydraliTraining:
    """`cfg` (a resolved, plain config of hydrali) trained through its backend; once() = one timed run."""

    def __init__(self, cfg: dict, name: str, run_dir: str, warmup: int, steps: int):
        self.cfg, self.name, self.run_dir = cfg, name, Path(run_dir)
        self.warmup, self.steps = warmup, steps
        self.repeat = 0

    def config(self, key: str):
        """The run's config: one epoch, quiet, this repeat's run dir, the step timer among the callbacks."""
        cfg = OmegaConf.create(self.cfg)
        backend = str(cfg.backend.name)
        with open_dict(cfg):
            cfg.epochs = 1
            cfg.paths.output_dir = str(self.run_dir / key)
            cfg.backend.callbacks = {
                **cfg.backend.callbacks,
                "bench_timer": {
                    "_target_": TIMERS[backend],
                    "key": key,
                    "warmup": self.warmup,
                    "steps": self.steps,
                    "images_per_step": int(cfg.data.batch_size),
                },
            }
            cfg.progress_bar = False
            if backend == "lightning":
                cfg.backend.trainer.enable_model_summary = False
        return cfg

    def once(self):
        """One run's timed window of steps (its Timing: images/s, and at the median step where timed)."""
        from hydrali.core.run.runner import run

        self.repeat += 1
        key = f"{self.name}-r{self.repeat}"
        run(self.config(key))
        if key not in STEP_WINDOWS:
            raise HydraliError(
                f"{self.name}: its epoch ended before {self.warmup} + {self.steps} steps: lower "
                f"bench.train.warmup / bench.train.steps or give it more training images"
            )
        return STEP_WINDOWS.pop(key)
