"""What is run by hand on the GPU machine (after ../shared/device/stage-wheels): checkpointing.sh measures what DALI's
reader checkpointing costs and checks a preemption signal on the GPU; signals.py finds which loaded library takes
signals over from Python."""
