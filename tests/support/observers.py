"""core's TrainingObserver recording into a run record in a test's folder, with tracking off."""

from __future__ import annotations

from pathlib import Path

from hydrali.core.run.observer import TrainingObserver
from hydrali.core.run.record import RunRecord
from hydrali.core.tracking.mlflow_runs import start_tracking


def untracked_observer(
    folder: Path, *, steps_per_epoch: int = 4, images_per_batch: int = 16, epochs: int = 3
) -> TrainingObserver:
    """An observer of `steps_per_epoch` steps an epoch (the first left out of steady state) recording into a run
    record of `epochs` epochs in `folder`."""
    tracker = start_tracking(
        enabled=False,
        is_global_zero=True,
        uri=None,
        experiment="x",
        artifact_location=None,
        output_dir=folder,
        run_name="x",
        sweep_dir=None,
        tags={},
    )
    record = RunRecord.open(folder, tracker, resume=False, writer=True, epochs=epochs)
    return TrainingObserver(record, images_per_batch=images_per_batch, steps_per_epoch=steps_per_epoch, warmup_steps=1)
