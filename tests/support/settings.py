"""Settings built as a run builds them (through core), for tests that drive a backend's parts directly."""

from __future__ import annotations

from omegaconf import OmegaConf

from hydrali.core.config.schema import OptimConfig
from hydrali.core.contracts.run import OptimizerSettings
from hydrali.core.run.contract import optimizer_settings


def optim_settings(**values) -> OptimizerSettings:
    """The OptimizerSettings a run with optim's defaults and `values` (optim.<key>=value) hands its backend."""
    return optimizer_settings(OmegaConf.merge(OmegaConf.structured(OptimConfig), values))
