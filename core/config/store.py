"""Every schema in Hydra's ConfigStore (core's groups, each registered backend's and task's own), and hydrali's
resolvers (the backends `hydrali --help` lists, a run's dir, ...)."""

from __future__ import annotations

import os
from importlib import resources

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from hydrali.core.config.derived import positive
from hydrali.core.config.image_size import by_size
from hydrali.core.config.schema import GROUP_SCHEMAS, HydraliConfig
from hydrali.core.contracts.registry import backend_specs, backends_help, task_specs
from hydrali.core.distributed.device_count import slurm_devices


def has_yaml(group: str, name: str) -> bool:
    """Whether conf/<group>/<name>.yaml ships with hydrali."""
    return resources.files("hydrali.conf").joinpath(group, f"{name}.yaml").is_file()


def output_dir() -> str:
    """This run's dir: Hydra's runtime.output_dir, or, before a job runs (`hydrali --cfg job --resolve`), the dir
    hydra.run.dir names."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    if OmegaConf.is_missing(hydra_cfg.runtime, "output_dir") or not hydra_cfg.runtime.output_dir:
        return os.path.abspath(hydra_cfg.run.dir)  # absolute, as Hydra's runtime.output_dir is
    return hydra_cfg.runtime.output_dir


def parallel_jobs(gpus, gpus_per_job) -> int:
    """How many jobs hydra/launcher=hydrali runs at once with hydra.launcher.gpus and gpus_per_job (1 with one GPU
    or none): the trials an Optuna search launches at a time."""
    from hydrali.core.distributed.gpu_placement import count_gpus, plan, visible_gpus

    return len(plan(visible_gpus(gpus, count_gpus), int(gpus_per_job)).slots)


def register_schemas() -> None:
    """Register every schema (idempotent). A YAML option pulls its schema through its defaults list
    (`/<name>_backend_schema`, `/<task>_task_schema@task`, `/<task>_data_schema@data`); a registered backend
    without a YAML file is an option of the `backend` group by its schema alone."""
    OmegaConf.register_new_resolver("hydrali_backends", backends_help, replace=True)  # conf/hydra/help
    OmegaConf.register_new_resolver("hydrali_slurm_devices", slurm_devices, replace=True)  # hydra/launcher=slurm
    OmegaConf.register_new_resolver("hydrali_by_size", by_size, replace=True)  # e.g. conf/model/sized_resnet.yaml
    OmegaConf.register_new_resolver("hydrali_positive", positive, replace=True)  # conf/task/classification.yaml
    OmegaConf.register_new_resolver("hydrali_output_dir", output_dir, replace=True)  # conf/paths/default.yaml
    OmegaConf.register_new_resolver("hydrali_parallel_jobs", parallel_jobs, replace=True)  # conf/hparams_search
    cs = ConfigStore.instance()
    cs.store(name="hydrali_schema", node=HydraliConfig)
    for group, node in GROUP_SCHEMAS.items():
        cs.store(name=f"{group}_schema", node=node)
    for name, spec in backend_specs().items():
        cs.store(name=f"{name}_backend_schema", node=spec.schema)
        if not has_yaml("backend", name):
            cs.store(group="backend", name=name, node=spec.schema)
    for name, spec in task_specs().items():
        cs.store(name=f"{name}_task_schema", node=spec.task_schema)
        cs.store(name=f"{name}_data_schema", node=spec.data_schema)
