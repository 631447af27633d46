"""What every torch backend shares, the Lightning backend's included: the DALI loaders of a process's shard, the
task's torch side (built, started from an earlier run, compiled), the optimizer and lr schedule of the plan, the
training device, the collective a task's validation gathers through, and the trained network and its export.

Nothing here imports Lightning (tests/test_architecture.py): a plain-PyTorch backend trains with it alone.
"""
