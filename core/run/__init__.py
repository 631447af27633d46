"""One run, start to end: the runner, its plan and epoch contract, record, checkpoints, summary."""
