"""Python's cyclic garbage collector in a process that exists to run one hydrali command.

Importing torch, TensorFlow, Lightning and DALI makes millions of objects that live until the process ends. Each full
collection walks all of them again, and so does the interpreter's last one at exit: on the 2-core CPU machine about
3 s of full collections during a run's start-up and 3-5 s after its summary (measured with gc.callbacks and py-spy:
`gc_collect_main` alone at exit). A command's process therefore pauses the collector until the run's frameworks are
loaded, then freezes what is alive (gc.freeze: those objects leave later collections, not memory), and freezes what
is left when the command ends. A sweep's worker process does the same for its first job, and after each job collects
what the job left and freezes the rest (`worker_job`). A run called from Python (a notebook, the tests) never pauses
or freezes: its process's objects are its own.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

_state = {"paused": False}  # whether command_process paused the collector and frameworks_loaded has not resumed it


@contextmanager
def _paused_then_frozen(pause: bool, collect_at_end: bool) -> Iterator[None]:
    """With `pause`, the collector off until `frameworks_loaded()`; at the end (an exit, an error, an interrupt) it is
    on again and every object left (after a collection, with `collect_at_end`) is frozen out of later ones."""
    if pause and gc.isenabled():
        gc.disable()
        _state["paused"] = True
    try:
        yield
    finally:
        _resume()
        if collect_at_end:
            gc.collect()
        gc.freeze()


def command_process(*, paused_until_loaded: bool):
    """Within it, this process exists to run one command: with `paused_until_loaded` the collector is off until
    `frameworks_loaded()`; at the end (an exit, an error, an interrupt) every object left is frozen, so that the
    interpreter's exit does not walk them (atexit functions and module teardown still run)."""
    return _paused_then_frozen(paused_until_loaded, collect_at_end=False)


def worker_job(*, first: bool):
    """Within it, one job of a process that exists to run a sweep's jobs one after another (a launcher's worker): its
    `first` job's imports are walked once (the collector paused until `frameworks_loaded()`, as in command_process);
    after each job, what it left is collected and what survives (the frameworks, the splits a worker keeps for its
    next job) is frozen out of later collections, so that the next job's collections walk its own objects only."""
    return _paused_then_frozen(first, collect_at_end=True)


def frameworks_loaded() -> None:
    """The run's frameworks are imported: where `command_process` paused the collector, the objects alive now are
    frozen out of later full collections and the collector resumes; elsewhere (a later job of a sweep, a run called
    from Python) nothing changes."""
    if _state["paused"]:
        gc.freeze()
        _resume()


def _resume() -> None:
    """The collector on again, if command_process paused it."""
    if _state["paused"]:
        _state["paused"] = False
        gc.enable()
