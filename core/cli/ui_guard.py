"""The guard of `hydrali ui`'s server: run as `python ui_guard.py <server group> <hydrali ui's pid>` by `hydrali ui`
(the standard library only, so it starts in a moment), in a session of its own (a terminal's Ctrl+C or a kill of
`hydrali ui`'s group does not reach it), it waits until `hydrali ui` ends, however it ends, and then stops the server's
whole process group (MLflow's server, uvicorn, its job runner's workers): SIGTERM, then SIGKILL after a grace.

`hydrali ui` stops the group itself when it can (Ctrl+C, SIGTERM, SIGHUP); killed with SIGKILL it cannot, and the
server's processes, in a group of their own, would keep the port. The kernel tells the guard: the parent-death signal
(prctl PR_SET_PDEATHSIG, asked for in the guard's own start; a parent already gone is seen by its pid)."""

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1  # prctl's option number (linux/prctl.h)
GRACE_S = 10.0  # how long the server's processes get to stop on SIGTERM before they are killed


def stop_group(group: int, while_waiting=lambda: None) -> None:
    """SIGTERM to the process group `group`, SIGKILL to what is left of it after GRACE_S; `while_waiting` is called
    at each check (the group leader's parent reaps it there, so that a zombie does not keep the group alive)."""
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        while_waiting()
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> None:
    """Wait for the parent named on the command line to end (or for SIGTERM from it), then stop the group named."""
    group, parent = int(sys.argv[1]), int(sys.argv[2])
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # kept pending until sigwait takes it: none is lost
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() == parent:  # else the parent ended before the request: no signal will come
        signal.sigwait({signal.SIGTERM})
    stop_group(group)


if __name__ == "__main__":
    main()
