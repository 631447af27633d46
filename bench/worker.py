"""Measurements that run in a worker process of their own (the benchmark's Keras side).

hydrali keeps frameworks apart (a Keras run never loads torch), and on a GPU machine TensorFlow may need
other CUDA libraries than torch (LD_LIBRARY_PATH is read once, when a process starts). So the benchmark's
TensorFlow measurements live in one spawned worker, started with `library_path` prepended to
LD_LIBRARY_PATH, and the main process drives them through `Remote` proxies: `once()` is a message, so the
repeats stay interleaved with the main process's measurements.

A measurement is named by a factory (an import path) and plain keyword arguments; the worker builds it
the first time it is asked for a repeat.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from contextlib import contextmanager


def _serve(conn) -> None:
    """The worker's loop: ("build", id, factory, kwargs) | ("once", id) | ("close", id) | None (exit)."""
    from hydra.utils import get_method

    built: dict = {}
    while True:
        message = conn.recv()
        if message is None:
            return
        kind, ident, *rest = message
        try:
            if kind == "build":
                factory, kwargs = rest
                built[ident] = get_method(factory)(**kwargs)
                conn.send(("ok", None))
            elif kind == "once":
                conn.send(("ok", built[ident].once()))
            elif kind == "close":
                measurement = built.pop(ident, None)
                if measurement is not None and hasattr(measurement, "close"):
                    measurement.close()
                conn.send(("ok", None))
        except Exception as err:  # noqa: BLE001 - sent back, raised in the main process
            conn.send(("error", f"{type(err).__name__}: {err}", traceback.format_exc()))


class RemoteError(RuntimeError):
    """A measurement failed in the worker (its message is the worker's exception)."""


class Worker:
    """One spawned worker process; started on first use, ended by `stop()`."""

    def __init__(self, library_path: str | None = None):
        self.library_path = library_path
        self._conn = None
        self._process = None
        self._next_id = 0

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        with _environment(self.library_path):
            self._process = context.Process(target=_serve, args=(child,), daemon=True, name="hydrali-bench-worker")
            self._process.start()
        child.close()
        self._conn = parent

    def call(self, *message):
        """Send one request and wait for its answer; a failure in the worker raises RemoteError."""
        if self._conn is None:
            self._start()
        self._conn.send(message)
        try:
            answer = self._conn.recv()
        except EOFError as err:
            raise RemoteError(f"the worker process ended (exit code {self._process.exitcode})") from err
        if answer[0] == "error":
            raise RemoteError(answer[1] + "\n" + answer[2])
        return answer[1]

    def new_id(self) -> int:
        """A fresh measurement id."""
        self._next_id += 1
        return self._next_id

    def stop(self) -> None:
        """End the worker process (if it was started)."""
        if self._conn is not None:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._process.join(timeout=60)
            if self._process.is_alive():
                self._process.terminate()
            self._conn = None


class Remote:
    """A measurement built and run in `worker`: factory(**kwargs) there, its once() and close() from here."""

    def __init__(self, worker: Worker, factory: str, **kwargs):
        self.worker, self.factory, self.kwargs = worker, factory, kwargs
        self.ident: int | None = None

    def once(self):
        """One timed repeat, in the worker (its Timing)."""
        if self.ident is None:
            self.ident = self.worker.new_id()
            self.worker.call("build", self.ident, self.factory, self.kwargs)
        return self.worker.call("once", self.ident)

    def close(self) -> None:
        """Free the measurement in the worker."""
        if self.ident is not None and self.worker._conn is not None:
            self.worker.call("close", self.ident)


@contextmanager
def _environment(library_path: str | None):
    """LD_LIBRARY_PATH with `library_path` first, for a process started inside the block."""
    previous = os.environ.get("LD_LIBRARY_PATH")
    if library_path:
        os.environ["LD_LIBRARY_PATH"] = library_path + (":" + previous if previous else "")
    try:
        yield
    finally:
        if library_path:
            if previous is None:
                os.environ.pop("LD_LIBRARY_PATH", None)
            else:
                os.environ["LD_LIBRARY_PATH"] = previous
