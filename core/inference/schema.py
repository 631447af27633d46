"""The schemas of the commands beside training: `hydrali eval`, `hydrali predict` and `hydrali export` (conf/eval.yaml,
conf/predict.yaml, conf/export.yaml: hydrali's whole config, which the run dir's record fills, plus each command's
own keys) and `hydrali convert` (conf/convert.yaml: hydrali's config naming the data, plus where and how to write
it). Hydra checks them at composition: an unknown key or a value of the wrong type is one line naming it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hydra.core.config_store import ConfigStore

from hydrali.core.config.schema import Choice, HydraliConfig


class Split(Choice):
    """The split `hydrali eval` scores."""

    val = "val"  # the run's validation split
    test = "test"  # a held-out split beside it (classification: <data.root>/test/<class>/)


class ExportFormat(Choice):
    """What `hydrali export` writes (core.inference.export; each backend says which it can)."""

    onnx = "onnx"  # ONNX (Lightning: torch.onnx; Keras: keras' own ONNX export)
    torchscript = "torchscript"  # a TorchScript program (Lightning)
    saved_model = "saved_model"  # a TensorFlow SavedModel (Keras: Model.export)


@dataclass
class UseConfig(HydraliConfig):
    """What every command on a trained run adds to hydrali's keys."""

    ckpt: str = "best"  # best | last | a checkpoint file


@dataclass
class EvalRoot(UseConfig):
    """conf/eval.yaml's top level."""

    split: Split = Split.val


@dataclass
class PredictRoot(UseConfig):
    """conf/predict.yaml's top level."""

    source: Optional[str] = None  # the folder of images to label (searched recursively)
    annotations: Optional[str] = None  # detection: a COCO file naming the images (its image ids are used)
    top_k: int = 5
    out: str = "predictions"  # the folder (relative: in the run dir) the predictions are written to


@dataclass
class ExportRoot(UseConfig):
    """conf/export.yaml's top level."""

    format: ExportFormat = ExportFormat.onnx
    out: str = "export"  # the folder (relative: in the run dir) whose <format>/ the exported model is written to
    check_images: int = 32  # validation images the exported model is checked on
    tolerance: float = 1e-4  # the largest absolute difference accepted between the export's outputs and the framework's


class ShardFormat(Choice):
    """What `hydrali convert` writes (core.data.convert)."""

    webdataset = "webdataset"  # WebDataset tar shards with DALI's index files (data=webdataset reads them)


@dataclass
class ConvertRoot(HydraliConfig):
    """conf/convert.yaml's top level."""

    out: Optional[str] = None  # the folder the shards are written to (required; absent or empty)
    format: ShardFormat = ShardFormat.webdataset
    shard_size: int = 1000  # samples per tar at most
    min_shards: int = 8  # tars per split at least (the most processes planned to read it), one sample each at least
    shuffle: bool = True  # the samples shuffled once (with seed) as they are written


SCHEMAS = {"eval": EvalRoot, "predict": PredictRoot, "export": ExportRoot, "convert": ConvertRoot}  # command -> schema


def register_use_schemas() -> None:
    """Register each command's schema in Hydra's ConfigStore as `hydrali_<command>_schema` (idempotent)."""
    store = ConfigStore.instance()
    for command, node in SCHEMAS.items():
        store.store(name=f"hydrali_{command}_schema", node=node)
