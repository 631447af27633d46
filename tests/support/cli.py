"""hydrali run as a user runs it, from this checkout: the environment a subprocess needs, `hydrali <args>` run to its
end or started in the background, and free TCP ports for the processes of one job."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hydrali.backends.keras import ENVIRONMENT as KERAS_ENVIRONMENT

REPO = Path(__file__).resolve().parents[2]
HYDRALI = ("-m", "hydrali.core")  # `python -m hydrali.core` is the `hydrali` command


def cli_env(extra: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment and `extra`, with this checkout first on PYTHONPATH (so that hydrali and the
    tests' `_target_` plug-ins import) and Hydra's one-line errors, less the variables hydrali's Keras backend sets
    where they are unset (this process imported it: conftest.py), so that a command sets them itself as in a shell,
    and less the variables `unset` names (whatever the caller of the tests set them to)."""
    inherited = {key: value for key, value in os.environ.items() if key not in (*KERAS_ENVIRONMENT, *unset)}
    env = {**inherited, "HYDRA_FULL_ERROR": "0", **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(path for path in (str(REPO), env.get("PYTHONPATH", "")) if path)
    return env


def run_cli(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: int = 600,
    entry: tuple[str, ...] = HYDRALI,
    unset: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """Run `python <entry> <args>` (by default `hydrali <args>`) in `cwd` to its end, its output captured as text;
    `env` added to the environment, `unset` taken out of it (cli_env)."""
    return subprocess.run(
        [sys.executable, *entry, *args],
        cwd=cwd,
        env=cli_env(env, unset),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    entry: tuple[str, ...] = HYDRALI,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    **popen,
) -> subprocess.Popen:
    """Start `python <entry> <args>` (by default `hydrali <args>`) in `cwd` without waiting for it: by default its
    stdout and stderr together on one text pipe. `popen`: more of Popen's arguments."""
    return subprocess.Popen(
        [sys.executable, *entry, *args], cwd=cwd, env=cli_env(env), stdout=stdout, stderr=stderr, text=True, **popen
    )


@functools.cache
def lightning_startup_seconds() -> float:
    """Seconds a fresh `python` takes, on this machine as loaded now, to import hydrali's Lightning backend (Lightning,
    torch, torchmetrics): the floor of any `hydrali` run that reaches that backend. Measured once a process, so that
    a test's bound on how soon a command answers holds on a busy machine (CI's 2 cores running 2 tests) as on a
    quiet one."""
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "import hydrali.core.cli.main, hydrali.backends.lightning.backend"],
        env=cli_env(),
        check=True,
        capture_output=True,
    )
    return time.monotonic() - started


def as_from_a_terminal() -> None:
    """Popen's preexec_fn for a run the test presses Ctrl+C in: SIGINT as a terminal delivers it, even when the
    tests themselves were started in the background (where a shell makes them, and their children, ignore it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    return free_ports(1)[0]
