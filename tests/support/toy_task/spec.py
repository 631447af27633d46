"""task=brightness as core sees it: the schemas of its `task` and `data` nodes, its TaskSpec, and the installed
distribution that registers it (an entry point of group hydrali.tasks, and its Hydra search path plugin), as a
third party would ship it. Light on purpose: every hydrali command reads every registered spec."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import MISSING

from hydrali.core.config.schema import TaskConfig
from hydrali.core.contracts.task import TaskSpec
from hydrali.core.data.image_files import BadFiles, Verify

REPO = Path(__file__).resolve().parents[3]


@dataclass
class BrightnessTaskConfig(TaskConfig):
    """conf/task/brightness.yaml: the task's node (nothing beyond what every task holds)."""


@dataclass
class BrightnessDataConfig:
    """conf/data/brightness.yaml: where the written images go, how many, and how they are batched."""

    name: str = MISSING
    root: str = MISSING
    batch_size: int = 16
    global_batch: Optional[int] = None
    image_size: int = 16
    images_per_class: int = 48  # per split
    num_classes: Optional[int] = None  # read by tasks/base.py's check_prepared (null: counted)
    verify: Verify = Verify.quick
    bad_files: BadFiles = BadFiles.fail


SPEC = TaskSpec(name="brightness", task_schema=BrightnessTaskConfig, data_schema=BrightnessDataConfig)


def install(site: Path) -> dict[str, str]:
    """Install task=brightness into the folder `site` as pip would lay out its wheel (a dist-info with the entry
    point, its Hydra plugin under hydra_plugins/) and return the environment of a Python that has it."""
    dist_info = Path(site) / "hydrali_brightness_task-0.1.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: hydrali-brightness-task\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[hydrali.tasks]\nbrightness = tests.support.toy_task.spec:SPEC\n")
    plugins = Path(site) / "hydra_plugins"  # a namespace package: Hydra scans every folder of it for plugins
    plugins.mkdir(exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("searchpath.py"), plugins / "hydrali_brightness_task.py")
    paths = [str(site), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
