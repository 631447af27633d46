"""TensorFlow's import without its start-up chatter.

Importing TensorFlow prints, from C++ and before any logging setting applies, the same block twice
(absl's "All log messages before absl::InitializeLog()", "Could not find cuda drivers", the CPU
instruction notice) and, on a machine without an NVIDIA driver, a `failed call to cuInit` error line.
None of it concerns the user; every other line is passed through.
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager

NOISE = (
    "All log messages before absl::InitializeLog() is called",
    "cudart_stub.cc",
    "cpu_feature_guard.cc",
    "To enable the following instructions:",
    "Unable to register cuDNN factory",
    "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory",
    "computation placer already registered",
    "oneDNN custom operations are on",  # absl's notice, printed whatever TF_CPP_MIN_LOG_LEVEL says
)
NO_DRIVER_NOISE = ("failed call to cuInit",)  # said only where no NVIDIA driver is installed
DRIVER = "/proc/driver/nvidia/version"


@contextmanager
def stderr_without(noise: tuple[str, ...]):
    """Capture what is written to file descriptor 2 (C++ included) and, at the end, pass on every line that
    contains none of `noise`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [
                line
                for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                if not any(n in line for n in noise)
            ]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def import_tensorflow():
    """Import TensorFlow and look up its devices once (where CUDA initialises), without the start-up chatter."""
    noise = NOISE + (() if os.path.exists(DRIVER) else NO_DRIVER_NOISE)
    with stderr_without(noise):
        import tensorflow as tf

        tf.config.list_physical_devices("GPU")
    return tf
