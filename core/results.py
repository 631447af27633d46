"""What a backend hands back to core after training: the contract of `backend.fit`."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FitResult:
    """The outcome of one backend's fit (its per-epoch metrics went to the run record): best checkpoint, throughput."""
    best_checkpoint: str | None = None
    first_epoch: int = 0            # 0-based index of the first epoch this invocation trained (>0 when resumed)
    epochs_completed: int = 0       # epochs done in total, resumed ones included
    train_images: int = 0           # images seen in training steps by all replicas, this invocation
    train_seconds: float = 0.0      # time spent in training steps (validation excluded)

    @property
    def images_per_second(self) -> float:
        """Training throughput of the whole job, in images per second."""
        return self.train_images / self.train_seconds if self.train_seconds > 0 else 0.0
