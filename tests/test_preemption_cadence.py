"""When the processes of a job agree on a preemption signal (core/process/preemption.CheckCadence, which the Lightning
backend's StopOnSignal asks after every training batch): within a bounded number of optimizer steps in every epoch,
whatever its length and the gradient accumulation, and never in the middle of an accumulation."""

from __future__ import annotations

import numpy as np
import pytest

from hydrali.core.process.preemption import CheckCadence


def _checks(cadence: CheckCadence, epochs: int, batches: int, accumulate: int) -> list[list[int]]:
    """Per epoch, the batch indices after which the processes agree."""
    return [[b for b in range(batches) if cadence.after_batch(b, batches, accumulate)] for _ in range(epochs)]


@pytest.mark.parametrize("batches", [1001, 1000, 37])
@pytest.mark.parametrize("accumulate", [1, 2, 3])
def test_several_processes_agree_every_n_optimizer_steps_in_every_epoch(batches, accumulate):
    """The issue's case among them: 2 processes, 1,001 batches an epoch, accumulation 2, every 10 steps. Counting
    batches over the run against the epoch's batch index, epoch 2 had no check at all: a signal in it waited for
    epoch 3, past SLURM's grace time."""
    every_n = 10
    for epoch, checks in enumerate(_checks(CheckCadence(every_n, processes=2), 3, batches, accumulate), start=1):
        optimizer_steps = -(-batches // accumulate)
        if optimizer_steps <= every_n:
            continue  # too short an epoch for a check inside it: its end is where the run stops
        assert checks, f"epoch {epoch}: no check in {batches} batches"
        assert all((b + 1) % accumulate == 0 for b in checks), "a check in the middle of an accumulation"
        assert batches - 1 not in checks, "a check after the epoch's last batch"
        gaps = np.diff([-1, *checks, batches - 1])  # from the epoch's start, between checks, to its end
        assert gaps.max() <= every_n * accumulate, (epoch, gaps.max())


def test_one_process_checks_after_every_optimizer_step_but_the_epoch_s_last():
    checks = _checks(CheckCadence(10, processes=1), 2, 9, 2)
    assert checks == [[1, 3, 5, 7], [1, 3, 5, 7]]  # batch 8 (the 9th) ends the epoch and its accumulation
