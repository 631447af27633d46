"""A network's own check of its settings (its name in its library's registry, a task's layout), run before anything
is written.

The builder that a model config names for the run's framework (its backend spec's network_key: `_target_` on
torch) may carry a `check` attribute: a callable taking the model config, raising HydraliError in one line that names
the fix (timm's builders check model.name against timm's registry, with a did-you-mean). A builder that cannot be
imported is left to the build.
"""

from __future__ import annotations

from omegaconf import DictConfig

from hydrali.core.contracts.registry import backend_spec, load_backend, task_specs


def check_network(cfg: DictConfig) -> None:
    """Run the check of the builder that `cfg.model` names for the run's backend, if it has one. A task's own
    network is checked by the framework-free check its TaskSpec names for the builder (network_checks); a builder's
    own `check` runs only for a network of a library (`model.name`: timm's, keras-hub's), as the task's builders'
    framework is not imported before the data is checked. The backend loads first, so that its
    framework is imported as it imports it (TensorFlow without its start-up chatter)."""
    from hydra.utils import get_method

    target = cfg.model.get(backend_spec(cfg.backend.name).network_key)
    layout_check = task_specs()[cfg.task.name].network_checks.get(str(target)) if target else None
    if layout_check:  # the task's own network: its framework-free check (layers and widths of as many stages, ...)
        get_method(layout_check)(cfg.model)
    if not target or cfg.model.get("name") is None:
        return
    load_backend(cfg.backend.name)
    try:
        builder = get_method(str(target))
    except Exception:  # noqa: BLE001 - a builder that cannot be had is named by the build, as before
        return
    check = getattr(builder, "check", None)
    if callable(check):
        check(cfg.model)
