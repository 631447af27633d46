"""Each validation's seconds, logged as it ends, to tell a first validation's compile from the steady cost (the run
summary's validation part is their sum). Added to a run as a user callback (backend.callbacks), on the GPU machine
after bench/gpu/env.sh:

    T=+backend.callbacks.timer={_target_:hydrali.bench.gpu.validation_timer
    bash bench/gpu/cifar10.sh "K=experiment=cifar10 backend=keras $T.keras}" "L=experiment=cifar10 $T.lightning}"

Each validation logs `validation N: S s (from its start to its end, callbacks of the epoch's end not included)`."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("hydrali")


class _Clock:
    """The start of the validation in progress and how many have ended."""

    def __init__(self):
        self.started: float | None = None
        self.count = 0

    def start(self) -> None:
        self.started = time.perf_counter()

    def end(self) -> None:
        if self.started is None:
            return
        self.count += 1
        log.info(
            "validation %d: %.3f s (from its start to its end, callbacks of the epoch's end not included)",
            self.count,
            time.perf_counter() - self.started,
        )
        self.started = None


def keras():
    """A Keras callback logging each validation's seconds (on_test_begin to on_test_end)."""
    import keras as keras_module

    class ValidationTimer(keras_module.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.clock = _Clock()

        def on_test_begin(self, logs=None):
            self.clock.start()

        def on_test_end(self, logs=None):
            self.clock.end()

    return ValidationTimer()


def lightning():
    """A Lightning callback logging each validation's seconds (on_validation_start to on_validation_end; CUDA
    synchronized at both ends)."""
    import lightning as L
    import torch

    class ValidationTimer(L.Callback):
        def __init__(self):
            self.clock = _Clock()

        def on_validation_start(self, trainer, pl_module):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.clock.start()

        def on_validation_end(self, trainer, pl_module):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.clock.end()

    return ValidationTimer()
