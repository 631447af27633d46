"""Callbacks the tests plug in through backend.callbacks (as a user plugs in their own)."""
import lightning as L


class InterruptAtEpoch(L.Callback):
    """Press Ctrl+C (raise KeyboardInterrupt) when epoch `epoch` (0-based) starts."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise KeyboardInterrupt
