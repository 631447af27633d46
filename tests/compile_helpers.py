"""What the compile tests plug into hydrali as a user would (backend.callbacks): observers of compilation that read
torch's and Keras' own state, not hydrali's."""


class RecordDynamoGraphs:
    """Write, as JSON to `path`, how many graphs TorchDynamo compiled while Lightning trained and validated
    (torch._dynamo's own counters, read at the start and the end of fit)."""

    def __new__(cls, path: str):
        import json

        import lightning as L

        def graphs() -> int:
            from torch._dynamo.utils import counters
            return int(counters["stats"]["unique_graphs"])

        class _Record(L.Callback):
            def on_fit_start(self, trainer, pl_module) -> None:
                self.before = graphs()

            def on_fit_end(self, trainer, pl_module) -> None:
                with open(path, "w") as fh:
                    json.dump({"graphs": graphs() - self.before}, fh)

        return _Record()


class KerasRecordJit:
    """Write, as JSON to `path`, whether the Keras model that trains is XLA-compiled (its `jit_compile`, which Keras
    itself turns off where XLA cannot run) and whether its train function was built, after the first epoch."""

    def __new__(cls, path: str):
        import json

        import keras

        class _Record(keras.callbacks.Callback):
            def on_epoch_end(self, epoch: int, logs=None) -> None:
                with open(path, "w") as fh:
                    json.dump({"jit_compile": bool(self.model.jit_compile),
                               "train_function": self.model.train_function is not None}, fh)

        return _Record()
