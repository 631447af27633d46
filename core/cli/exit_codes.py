"""The exit codes of every hydrali command (documented in `hydrali --help`)."""

EXIT_USER_ERROR = 2  # a mistake the user can fix: the one line on stderr names it
EXIT_INTERRUPTED = 130  # Ctrl+C (128 + SIGINT), as shells report it
EXIT_FAILED_SWEEP = 1  # -m: every job of the sweep failed
EXIT_SIGNAL_BASE = 128  # a run stopped by a preemption signal (after its checkpoint): 128 + the signal
