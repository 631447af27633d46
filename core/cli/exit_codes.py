"""The exit codes of every hydrali command (documented in `hydrali --help`)."""

from hydrali.core.errors import EXIT_USER_ERROR  # a mistake the user can fix: the one line on stderr names it
from hydrali.core.process.preemption import EXIT_SIGNAL_BASE

EXIT_INTERRUPTED = 130  # Ctrl+C (128 + SIGINT), as shells report it
EXIT_FAILED_SWEEP = 1  # -m: a job of the sweep failed (the others ran; the table names it)
# EXIT_SIGNAL_BASE + N: a run stopped by preemption signal N after its checkpoint (core/process/preemption.py)
__all__ = ["EXIT_USER_ERROR", "EXIT_INTERRUPTED", "EXIT_FAILED_SWEEP", "EXIT_SIGNAL_BASE"]
