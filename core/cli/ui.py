"""`hydrali ui [overrides]`: MLflow's UI over the store hydrali is configured to write (tracking.uri), on
tracking.ui_host:tracking.ui_port (127.0.0.1:5000 by default). The same overrides as a run choose the store,
e.g. `hydrali ui paths.root=/experiments` or `hydrali ui tracking.ui_port=5001`. It prints the address of the
experiment's runs list (MLflow 3 opens on its GenAI welcome page otherwise) once the server answers there; a taken
port is one line. The server runs in a process group of its own, which SIGTERM or Ctrl+C stops whole, and which a
guard process stops when `hydrali ui` ends any other way (SIGKILL: core/cli/ui_guard.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hydrali.core.cli import ui_guard
from hydrali.core.errors import HydraliError

USAGE = (
    "usage: hydrali ui [key=value ...]\n\n"
    "MLflow's UI over the store hydrali writes (tracking.uri), on tracking.ui_host:tracking.ui_port (127.0.0.1:5000).\n"
    "The same overrides as a run choose the store: hydrali ui paths.root=/experiments, hydrali ui tracking.ui_port=5001"
)


def tracking_settings(overrides: list[str]) -> tuple[str, str, int, str]:
    """(store uri, host, port, experiment) of the config that `hydrali <overrides>` would run."""
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_module(config_module="hydrali.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # so that ${hydra:runtime.cwd} in paths.root resolves
    if not cfg.tracking.enabled or not cfg.tracking.uri:
        raise HydraliError("tracking is off (tracking=none): there is no MLflow store to browse")
    return str(cfg.tracking.uri), str(cfg.tracking.ui_host), int(cfg.tracking.ui_port), str(cfg.tracking.experiment)


PORTS_TRIED = 100  # how far past a taken port the next free one is looked for


def _is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        # as a server binds it: connections closed in the last minute (TIME_WAIT) do not make it taken
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def check_port(host: str, port: int) -> None:
    """One line naming a free port when `port` is taken on `host` (MLflow's server would bury it in its log)."""
    if _is_free(host, port):
        return
    free = next((p for p in range(port + 1, port + PORTS_TRIED) if _is_free(host, p)), None)
    hint = f"pass tracking.ui_port={free} (free now)" if free else "pass tracking.ui_port=<a free port>"
    raise HydraliError(f"tracking.ui_port={port} is taken on {host} (another server listens there): {hint}")


def runs_url(uri: str, host: str, port: int, experiment: str) -> str:
    """The address of the experiment's runs list in MLflow's UI; one line if the store holds no such experiment."""
    from hydrali.core.tracking.mlflow_runs import quiet_mlflow_loggers

    quiet_mlflow_loggers()
    from mlflow.tracking import MlflowClient

    found = MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment)
    if found is None:
        raise HydraliError(
            f"the MLflow store {uri} holds no experiment {experiment!r} yet: run hydrali first, or pass "
            f"tracking.experiment=<one of its experiments>"
        )
    return f"http://{host}:{port}/#/experiments/{found.experiment_id}/runs"


# MLflow's start-up chatter that `hydrali ui` does not pass on (its own line says where the UI is): the uvicorn and
# MLflow loggers are set to warnings (below), these lines are printed directly.
CHATTER = ("[MLflow] Security middleware enabled with default settings",)
# Uvicorn's workers import starlette.middleware.wsgi through MLflow, which warns about it in each of them.
SERVER_WARNINGS = "ignore:starlette.middleware.wsgi is deprecated"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GUARD_WAIT_S = 30.0  # how long `hydrali ui` waits for its guard to end (it stops an empty group at once)
READY_POLL_S = 0.2  # how often `hydrali ui` asks whether the server accepts connections, before it prints its address


def server_command(uri: str, host: str, port: int) -> list[str]:
    """`mlflow ui` over `uri`, with the registry on the same store and uvicorn saying only warnings and errors."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--registry-store-uri", uri,
            "--host", host, "--port", str(port), "--uvicorn-opts", "--log-level warning"]  # fmt: skip


def server_env() -> dict[str, str]:
    env = dict(os.environ, MLFLOW_LOGGING_LEVEL="WARNING")
    env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), SERVER_WARNINGS]))
    return env


def stop_group(server: subprocess.Popen) -> None:
    """SIGTERM to the server's whole process group (uvicorn's workers, MLflow's job runner and its huey consumers),
    SIGKILL to what is left of it after a grace (the server leads its own group: process_group=0)."""
    ui_guard.stop_group(server.pid, while_waiting=server.poll)
    server.wait()


def serve(overrides: list[str]) -> int:
    """Run `mlflow ui` over the configured store in a process group of its own, passing on its output but its
    start-up chatter; SIGTERM, SIGINT (Ctrl+C) or SIGHUP stop the whole group, so no worker of it lives on."""
    uri, host, port, experiment = tracking_settings(overrides)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        raise HydraliError(
            f"no MLflow store at {uri} yet: run hydrali first, or point tracking.uri (or "
            f"paths.root) at an existing store"
        )
    check_port(host, port)
    url = runs_url(uri, host, port, experiment)
    server = subprocess.Popen(
        server_command(uri, host, port),
        env=server_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        process_group=0,  # its own group: a terminal's Ctrl+C reaches hydrali only, which stops the whole group
    )

    def stop(signum: int, _frame: object) -> None:
        stop_group(server)
        sys.exit(0)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    # the server's group ends with this process, even one killed with SIGKILL (core/cli/ui_guard.py)
    guard = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("ui_guard.py")), str(server.pid), str(os.getpid())],
        start_new_session=True,
    )
    try:
        if answers_when_up(server, host, port):
            print(
                f"hydrali: MLflow UI: the runs of experiment {experiment!r} are at {url} (store {uri}; Ctrl+C stops it)"
            )
            sys.stdout.flush()
        for line in server.stdout:
            if not line.startswith(CHATTER):
                sys.stdout.write(line)
                sys.stdout.flush()
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        stop_group(server)
        guard.terminate()  # its group is gone: it ends at once
        try:
            guard.wait(timeout=GUARD_WAIT_S)
        except subprocess.TimeoutExpired:
            guard.kill()
    return server.returncode


def answers_when_up(server: subprocess.Popen, host: str, port: int) -> bool:
    """Wait until the server accepts connections on host:port (True), or ends first (False: its output says why)."""
    while server.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=READY_POLL_S):
            return True
        time.sleep(READY_POLL_S)
    return False
