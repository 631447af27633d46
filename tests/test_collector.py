"""The garbage collector's policy in a hydrali command's process (core/process/collector.py): paused while the
frameworks are imported, on again for training with the imported objects frozen, and everything frozen at the end so
that the interpreter's exit does not walk it; a run called from Python keeps its process's collector as it was. Each
case runs in its own interpreter: the collector is the process's."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_command_pauses_the_collector_until_its_frameworks_are_loaded_then_freezes_them():
    out = _run_python(
        """
        import gc
        from hydrali.core.process import collector
        with collector.command_process(paused_until_loaded=True):
            paused = not gc.isenabled()
            imported = [object() for _ in range(1000)]  # what an import leaves
            collector.frameworks_loaded()
            frozen_at_load, on_for_training = gc.get_freeze_count(), gc.isenabled()
            collector.frameworks_loaded()  # a later job of a sweep in the same process
            frozen_again = gc.get_freeze_count()
        print(paused, frozen_at_load > 0, on_for_training, frozen_again == frozen_at_load, gc.isenabled())
        """
    )
    assert out == "True True True True True"


def test_a_command_that_ends_before_loading_a_framework_leaves_the_collector_on_and_its_objects_frozen():
    out = _run_python(
        """
        import gc
        from hydrali.core.process import collector
        try:
            with collector.command_process(paused_until_loaded=True):
                raise SystemExit(2)  # a mistake in the command line
        except SystemExit:
            pass
        print(gc.isenabled(), gc.get_freeze_count() > 0)
        """
    )
    assert out == "True True"


def test_a_command_that_does_not_pause_keeps_collecting_and_a_run_from_python_changes_nothing():
    out = _run_python(
        """
        import gc
        from hydrali.core.process import collector
        collector.frameworks_loaded()  # a run called from Python: no command_process
        untouched = (gc.isenabled(), gc.get_freeze_count())
        with collector.command_process(paused_until_loaded=False):  # hydrali eval, ui, hydrali-bench
            collecting = gc.isenabled()
        print(untouched, collecting)
        """
    )
    assert out == "(True, 0) True"
