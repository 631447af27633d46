"""What a backend hands back to core after training: the contract of `backend.fit`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FitResult:
    """The outcome of one backend's fit (its per-epoch metrics went to the run record): best checkpoint, throughput."""

    best_checkpoint: str | None = None
    best_checkpoint_epoch: int | None = None  # the epochs best_checkpoint holds (core reads them after fit)
    first_epoch: int = 0  # 0-based index of the first epoch this invocation trained (>0 when resumed)
    epochs_completed: int = 0  # epochs done in total, resumed ones included
    train_seconds: float = 0.0  # time spent in training steps (validation excluded), this invocation
    steady_images_per_second: float | None = None  # the same without each epoch's first steps (core/run/throughput.py)
    first_step_seconds: float | None = None  # the first epoch's start to the end of its first step (compile warm-up)
    validation_seconds: float = 0.0  # time spent validating, this invocation (core/run/observer.py)
    training_started: float | None = None  # time.perf_counter() at the first epoch's start (None: no epoch ran)
    compiled: bool = False  # the model ran compiled (backend.compile: torch.compile or XLA)
