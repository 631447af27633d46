"""A Keras run's network loaded from one of its checkpoints for inference (core.contracts.backend.TrainedNetwork):
built under the run's dtype policy, called in inference mode through one tf.function; exported as a TensorFlow
SavedModel (keras.export.ExportArchive: one serving_default endpoint taking `images`) or ONNX (Model.export, through
tf2onnx), and checked with TensorFlow or onnxruntime."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hydrali.backends.keras.precision import dtype_policy
from hydrali.backends.keras.side import build_keras_side, load_network
from hydrali.backends.keras.strategy import configure_devices, visible_gpus
from hydrali.core.contracts.run import TrainedRunSpec
from hydrali.core.errors import HydraliError, first_line

LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"  # TensorFlow's C++ log level (backends/keras/__init__.py sets its default)
SERVING_ENDPOINT = "serving_default"  # the SavedModel's signature (what TensorFlow Serving calls by default)


class _Serving(keras.Model):
    """What is exported: the side's `serving` (by default its `predict`) of the network on images alone, as a model
    whose outputs are named (a subclass, so that a side's TensorFlow ops, e.g. detection's box decoding, may run in
    it)."""

    def __init__(self, network: keras.Model, serving, names: tuple[str, ...]):
        super().__init__(name="serving")  # a TensorFlow scope name (the class's own starts with _)
        self.network = network
        self._serving = serving
        self.names = tuple(names)

    def call(self, images):
        outputs = self._serving(self.network, {"images": images})
        return {name: outputs[name] for name in self.names}


class KerasTrainedNetwork:
    """The network of a Keras run with its weights, and the task side's predictions on it."""

    def __init__(self, network: keras.Model, side):
        self.network = network
        self.side = side
        self.formats = ("saved_model", "onnx")
        self.serving_names = tuple(side.serving_names)
        self._serving = side.serving  # what is exported: the side's `serving` (by default its `predict`)
        self._predict = tf.function(lambda batch: side.predict(network, batch), reduce_retracing=True)

    def predict(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        """The side's predictions (its `predict`) for a batch of recipe outputs, as NumPy float32 arrays."""
        tensors = {k: tf.convert_to_tensor(v) for k, v in batch.items() if isinstance(v, np.ndarray)}
        return {name: np.asarray(value, dtype=np.float32) for name, value in self._predict(tensors).items()}

    def serve(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        """What the exported model computes (the side's `serving`, by default its `predict`), by Keras."""
        outputs = self._serving(self.network, {"images": tf.convert_to_tensor(batch["images"])})
        return {name: np.asarray(outputs[name], dtype=np.float32) for name in self.serving_names}

    def _serving_model(self) -> keras.Model:
        return _Serving(self.network, self._serving, self.serving_names)

    def export(self, fmt: str, folder: Path, example: dict[str, Any]) -> Path:
        """The network as a SavedModel (endpoint `serve`) or an ONNX file, in `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        model = self._serving_model()
        model(tf.convert_to_tensor(example["images"][:1]))  # Keras exports a model that was called
        if fmt == "saved_model":  # one endpoint, its input named `images` (preprocessing.json's input)
            path = folder / "model"
            archive = keras.export.ExportArchive()
            archive.track(model)
            spec = tf.TensorSpec((None, *example["images"].shape[1:]), tf.as_dtype(example["images"].dtype), "images")
            archive.add_endpoint(name=SERVING_ENDPOINT, fn=model.call, input_signature=[spec])
            archive.write_out(str(path), verbose=False)
            return path
        path = folder / "model.onnx"
        log_level = os.environ.get(LOG_LEVEL)  # tf2onnx's import sets 3 for the whole process and its children
        try:
            with warnings.catch_warnings():  # keras' bundled tf2onnx looks for np.object, which NumPy warns about
                warnings.filterwarnings("ignore", message="In the future `np.object`", category=FutureWarning)
                model.export(str(path), format="onnx", verbose=False)
        finally:
            if log_level is None:
                os.environ.pop(LOG_LEVEL, None)
            else:
                os.environ[LOG_LEVEL] = log_level
        return path

    def run_export(self, path: Path, fmt: str, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        """The exported model's outputs on `batch` by its own runtime: TensorFlow (SavedModel) or onnxruntime."""
        images = np.ascontiguousarray(batch["images"], dtype=np.float32)
        names = list(self.serving_names)
        if fmt == "saved_model":
            loaded = tf.saved_model.load(str(path))
            outputs = loaded.signatures[SERVING_ENDPOINT](images=tf.constant(images))
            return {name: np.asarray(outputs[name], dtype=np.float32) for name in names}
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        fed = {session.get_inputs()[0].name: images}
        produced = dict(zip((o.name for o in session.get_outputs()), session.run(None, fed)))
        return {name: produced[name] for name in names}


def load_trained(*, run: TrainedRunSpec, task, dataset, checkpoint: Path) -> KerasTrainedNetwork:
    """The task's Keras side of the trained `run`, its network built untrained under the run's precision and
    loaded from the Keras checkpoint `checkpoint`; one line when it does not fit."""
    if visible_gpus():
        configure_devices(1, "gpu")  # GPU memory taken as needed (DALI decodes on the same GPU), before any tensor
    side = build_keras_side(task, dataset)
    try:
        with dtype_policy(run.precision):
            network = load_network(side, run.model, dataset.num_classes, run.image_size, checkpoint)
    except Exception as err:
        raise HydraliError(f"{checkpoint} does not fit the run's network ({first_line(err)})") from err
    return KerasTrainedNetwork(network, side)
