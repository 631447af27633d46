"""A torch run's network loaded from one of its checkpoints for inference (core.contracts.backend.TrainedNetwork):
the task's torch side in evaluation mode, at the run's precision, on the GPU when torch sees one (and
backend.accelerator allows); exported with torch's own exporters (torch.onnx, TorchScript) and checked with
onnxruntime or TorchScript. The checkpoint is a Lightning checkpoint file (the side's weights in its `state_dict`),
read by torch alone."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hydrali.backends.torch.side import SIDE, build_torch_side
from hydrali.core.contracts.run import TrainedRunSpec
from hydrali.core.errors import HydraliError, first_line

ONNX_OPSET = 18  # the ONNX opset written (onnxruntime 1.16 and later run it)


def _numpy(value: torch.Tensor) -> np.ndarray:
    return value.detach().float().cpu().numpy()


class TorchTrainedNetwork:
    """The task's torch side with a run's weights, in evaluation mode. `precision(device_type)` (cpu | cuda): the
    run's precision on that device, an object whose `forward_context()` (autocast) every prediction runs in (the
    Lightning backend passes its precision plugin of backend.precision)."""

    def __init__(self, side: torch.nn.Module, precision: Callable[[str], Any], accelerator: str = "auto"):
        gpu = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
        self.device = torch.device("cuda" if gpu else "cpu")  # as backend.accelerator chose for training
        self.side = side.to(self.device).eval()
        self.precision = precision(self.device.type)
        self.formats = ("onnx", "torchscript")

    def _tensors(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {k: torch.as_tensor(v).to(self.device) for k, v in batch.items() if isinstance(v, np.ndarray)}

    def predict(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        """The side's predictions (its `predict`) for a batch of recipe outputs, as NumPy arrays."""
        with torch.inference_mode(), self.precision.forward_context():
            outputs = self.side.predict(self._tensors(batch))
        return {name: _numpy(value) for name, value in outputs.items()}

    def serve(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        """What the exported model computes (the side's `serving`, by default its `predict`), by torch in float32 (no
        TF32 on GPUs: the reference an export is checked against)."""
        with torch.inference_mode(), _full_float32():
            outputs = _ExportedNetwork(self.side)(self._tensors(batch)["images"])
        return {name: _numpy(value) for name, value in zip(_ExportedNetwork(self.side).output_names, outputs)}

    def export(self, fmt: str, folder: Path, example: dict[str, Any]) -> Path:
        """The network as ONNX (torch.onnx, batch dimension dynamic) or TorchScript (traced), in `folder`."""
        images = self._tensors(example)["images"]
        network = _ExportedNetwork(self.side).eval()
        folder.mkdir(parents=True, exist_ok=True)
        if fmt == "torchscript":
            path = folder / "model.pt"
            with torch.no_grad(), _torchscript_asked_for():
                torch.jit.trace(network, images).save(str(path))
            return path
        path = folder / "model.onnx"
        with torch.no_grad():
            torch.onnx.export(
                network,
                (images,),
                str(path),
                input_names=["images"],
                output_names=network.output_names,
                dynamic_axes={"images": {0: "batch"}, **{name: {0: "batch"} for name in network.output_names}},
                opset_version=ONNX_OPSET,
                dynamo=False,
            )
        return path

    def run_export(self, path: Path, fmt: str, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        """The exported model's outputs on `batch` by its own runtime: onnxruntime (CPU) or TorchScript."""
        images = np.ascontiguousarray(batch["images"], dtype=np.float32)
        names = _ExportedNetwork(self.side).output_names
        if fmt == "torchscript":
            with _torchscript_asked_for():
                program = torch.jit.load(str(path), map_location="cpu")
            with torch.no_grad():
                outputs = program(torch.from_numpy(images))
            return {name: _numpy(value) for name, value in zip(names, outputs)}
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return dict(zip(names, session.run(names, {"images": images})))


@contextlib.contextmanager
def _torchscript_asked_for():
    """torch.jit without torch's deprecation warnings: format=torchscript names TorchScript, which serving stacks
    still load (torch deprecates torch.jit.trace/load in favour of torch.export; format=onnx is the other choice, and
    README says so), so its FutureWarnings tell the user nothing they can act on in this command."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        yield


@contextlib.contextmanager
def _full_float32():
    """float32 matrix products and convolutions without TF32 (which Ampere and later GPUs use by default)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class _ExportedNetwork(torch.nn.Module):
    """What is exported: the side's `serving` (by default its `predict`) on images alone, its outputs in a fixed order
    (a tuple, also of one output)."""

    def __init__(self, side: torch.nn.Module):
        super().__init__()
        self.side = side
        self.output_names = list(side.serving_names)
        self._outputs = side.serving

    def forward(self, images: torch.Tensor):
        outputs = self._outputs({"images": images})
        return tuple(outputs[name] for name in self.output_names)


def load_trained(
    *, run: TrainedRunSpec, task, dataset, checkpoint: Path, precision: Callable[[str], Any], backend: str
) -> TorchTrainedNetwork:
    """The task's torch side of the trained `run` (its network built untrained), with the weights of the Lightning
    checkpoint `checkpoint`, at `precision` (as TorchTrainedNetwork takes it); one line when it does not fit.
    `backend`: the backend that asks (named by an error)."""
    side = build_torch_side(task, dataset, model=run.model, image_size=run.image_size, backend=backend)
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)["state_dict"]
    except Exception as err:  # torch raises many types for a file that is not a checkpoint
        raise HydraliError(f"{checkpoint} cannot be read as a Lightning checkpoint ({first_line(err)})") from err
    prefix = SIDE + "."
    try:
        side.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
    except RuntimeError as err:
        raise HydraliError(
            f"{checkpoint} holds the weights of another network ({str(err).splitlines()[-1].strip()}): pass a "
            f"checkpoint of this run"
        ) from err
    return TorchTrainedNetwork(side, precision, str(getattr(run.backend, "accelerator", "auto")))
