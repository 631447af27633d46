"""One run, start to end: the runner, its plan and epoch steps, record, checkpoints, summary."""
