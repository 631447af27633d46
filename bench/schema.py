"""The schema of `hydrali-bench`'s config (conf/bench.yaml): hydrali's whole config plus a `bench` node.

Hydra checks every composed benchmark config against it: an unknown `bench.` key or a value of the
wrong type fails at composition, naming the key (as hydrali.core.config.schema does for hydrali's own keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from hydrali.core.config.schema import Choice, HydraliConfig

SCHEMA_NAME = "hydrali_bench_schema"


class Section(Choice):
    """The parts of the benchmark (issue 11), in the order they run."""

    loaders = "loaders"  # 1: each recipe through hydrali's data layers, raw DALI, a PIL DataLoader
    cpu = "cpu"  # 4: DALI's CPU operators against the PIL DataLoader on the same cores
    lightning = "lightning"  # 2: ResNet-50 through the Lightning backend, its upper bound, a plain PyTorch loop
    keras = "keras"  # 3: the same network through the Keras backend against Keras' own upper bound
    detection = "detection"  # 5: the ssd recipe's images/s and the detector's training images/s on each backend
    scaling = "scaling"  # 6: whole hydrali runs on 1 GPU and on several, per backend (the ratio is the scaling)
    small = "small"  # 7: experiment=cifar10 (32 px) through Lightning, from the files and decoded once, its bound
    sweep = "sweep"  # 8: one sweep (hydrali -m) with Hydra's sequential launcher and hydrali's parallel one


class Layer(Choice):
    """hydrali's data layers: the iterator each backend trains from."""

    lightning = "lightning"  # DaliDataModule's loader (DALIGenericIterator), torch tensors
    keras = "keras"  # the backend's DALIDataset, read by a tf.function as Keras' train step reads it


@dataclass
class SyntheticConfig:
    """bench.synthetic: the ImageNet-like JPEG folder written once when no data.root is given."""

    classes: int = 8
    train_per_class: int = 1000
    val_per_class: int = 4


@dataclass
class TrainBenchConfig:
    """bench.train: training throughput (sections 2, 3 and 5's training rows)."""

    overrides: List[str] = field(default_factory=list)
    lightning: List[str] = field(default_factory=list)
    keras: List[str] = field(default_factory=list)
    keras_loops: List[int] = field(default_factory=list)
    warmup: int = 10
    steps: int = 20


@dataclass
class DetectionBenchConfig:
    """bench.detection: section 5's own hydrali overrides (its data, model, batch)."""

    overrides: List[str] = field(default_factory=list)


@dataclass
class ScalingBenchConfig:
    """bench.scaling: section 6's runs, GPU counts, overrides and synthetic folder."""

    runs: List[str] = field(default_factory=list)
    devices: List[int] = field(default_factory=list)
    overrides: List[str] = field(default_factory=list)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class PhotosBenchConfig:
    """A section that runs hydrali on photos: its hydrali overrides and where the photos are (null: a synthetic
    folder). Its values are conf/bench.yaml's (the one place they are set, with their comments): a key left out of it
    is an error, not a silent default."""

    overrides: List[str] = MISSING
    root: Optional[str] = MISSING


@dataclass
class SmallBenchConfig(PhotosBenchConfig):
    """bench.small: section 7 (32 x 32 photos, experiment=cifar10)."""

    warmup: int = MISSING
    steps: int = MISSING
    synthetic: SyntheticConfig = MISSING


@dataclass
class SweepBenchConfig(PhotosBenchConfig):
    """bench.sweep: section 8 (one sweep on each launcher)."""

    grid: str = MISSING
    gpus_per_job: int = MISSING
    repeats: int = MISSING


@dataclass
class BenchConfig:
    """bench: what `hydrali-bench` measures and how much (documented in conf/bench.yaml)."""

    sections: List[Section] = field(default_factory=lambda: list(Section))
    repeats: int = 3
    warmup: int = 5
    batches: int = 20
    recipes: List[str] = field(default_factory=lambda: ["standard", "light"])
    layers: List[Layer] = field(default_factory=lambda: list(Layer))
    workers: Optional[int] = None
    cpu_threads: Optional[int] = None
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    train: TrainBenchConfig = field(default_factory=TrainBenchConfig)
    detection: DetectionBenchConfig = field(default_factory=DetectionBenchConfig)
    scaling: ScalingBenchConfig = field(default_factory=ScalingBenchConfig)
    small: SmallBenchConfig = field(default_factory=SmallBenchConfig)
    sweep: SweepBenchConfig = field(default_factory=SweepBenchConfig)
    keras_library_path: Optional[str] = None
    json: str = "bench.json"


@dataclass
class BenchRoot(HydraliConfig):
    """conf/bench.yaml's top level: hydrali's keys (conf/config.yaml) and `bench`."""

    bench: BenchConfig = field(default_factory=BenchConfig)


def register_bench_schema() -> None:
    """Register the benchmark's schema in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=BenchRoot)
