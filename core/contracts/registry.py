"""The backends and tasks hydrali knows: its own, and any that an installed package declares.

A package adds a backend (or a task) without touching hydrali by declaring an entry point in the
`hydrali.backends` (`hydrali.tasks`) group, `<name> = "<module>:<BackendSpec (TaskSpec) object>"` (pyproject.toml:
`[project.entry-points."hydrali.backends"]`), and a config group option of that name (a YAML file in a Hydra search
path; a backend with no YAML gets its schema's defaults). Reading the registry imports only light spec modules,
never torch or TensorFlow: `hydrali --help`, the config schema and checkpoint resolution read it; a run loads its
one backend's implementation.
"""

from __future__ import annotations

import importlib
import threading
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from hydrali.core.contracts.backend import Backend, BackendSpec
from hydrali.core.contracts.task import TaskSpec
from hydrali.core.errors import HydraliError, first_line

BACKEND_ENTRY_POINTS = "hydrali.backends"
BUILTIN_BACKENDS = {  # name -> "module:object" of its BackendSpec
    "lightning": "hydrali.backends.lightning.spec:SPEC",
    "keras": "hydrali.backends.keras.spec:SPEC",
}
TASK_ENTRY_POINTS = "hydrali.tasks"
BUILTIN_TASKS = {  # name -> "module:object" of its TaskSpec
    "classification": "hydrali.tasks.classification.spec:SPEC",
    "detection": "hydrali.tasks.detection.spec:SPEC",
}


def _load(target: str):
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _specs(builtin: dict[str, str], group: str, kind: type) -> dict:
    targets = dict(builtin)
    for entry in entry_points(group=group):
        targets.setdefault(entry.name, entry.value)
    specs = {}
    for name, target in targets.items():
        try:
            spec = _load(target)
        except Exception as err:  # a broken plug-in is named in one line, whatever it raised
            raise HydraliError(
                f"the {group} entry {name!r} ({target}) cannot be loaded ({first_line(err)}): fix or uninstall "
                f"the package that declares it"
            ) from err
        if not isinstance(spec, kind) or spec.name != name:
            raise HydraliError(f"the entry {name!r} of {group} ({target}) is not a {kind.__name__} named {name!r}")
        specs[name] = spec
    return specs


@cache
def backend_specs() -> dict[str, BackendSpec]:
    """Every registered backend's spec, by name: hydrali's own, then those of installed packages' entry points."""
    return _specs(BUILTIN_BACKENDS, BACKEND_ENTRY_POINTS, BackendSpec)


@cache
def task_specs() -> dict[str, TaskSpec]:
    """Every registered task's spec, by name: hydrali's own, then those of installed packages' entry points."""
    return _specs(BUILTIN_TASKS, TASK_ENTRY_POINTS, TaskSpec)


def backend_spec(name: str) -> BackendSpec:
    """The spec of backend `name`; a HydraliError listing the backends when there is none of that name."""
    specs = backend_specs()
    if name not in specs:
        raise HydraliError(f"backend={name} does not exist: choose backend= one of {', '.join(sorted(specs))}")
    return specs[name]


def load_backend(name: str) -> Backend:
    """Backend `name`, ready to train (its framework is imported now: a Keras run never loads torch)."""
    spec = backend_spec(name)
    module = spec.implementation.partition(":")[0]
    try:
        implementation = _load(spec.implementation)
    except ModuleNotFoundError as err:
        if err.name and module.startswith(err.name):
            raise HydraliError(f"backend={name}: its implementation {spec.implementation} cannot be found") from err
        raise HydraliError(f"backend={name} needs a package that is not installed: {err.name}") from err
    return implementation()


def network_key(framework: str) -> str:
    """The key of a model config that names the builder of `framework`'s network (its backends' specs' network_key;
    `_target_` for a framework no backend declares)."""
    return next((spec.network_key for spec in backend_specs().values() if spec.framework == framework), "_target_")


def network_keys() -> tuple[str, ...]:
    """Every key of a model config that names a network's builder (one per framework), `_target_` first."""
    return tuple(dict.fromkeys(["_target_", *(spec.network_key for spec in backend_specs().values())]))


_imports_ahead: dict[str, threading.Thread] = {}  # backend name -> the thread importing its implementation


def import_ahead(name: str) -> threading.Thread | None:
    """Start importing backend `name`'s implementation (its framework: torch, TensorFlow) in a thread of this
    process, once, so that the work done meanwhile (a job's config, its data check) overlaps it; load_backend then
    finds it imported, or waits for the import to end. For a process that outlives a failed job (a sweep's worker):
    what the import raises is left to load_backend, which reports it. None where it started before or is unknown."""
    if name in _imports_ahead or name not in backend_specs():
        return None
    module = backend_specs()[name].implementation.partition(":")[0]

    def import_quietly() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the job's own load_backend imports it again and names what is wrong
            pass

    thread = _imports_ahead[name] = threading.Thread(target=import_quietly, name=f"import-{name}", daemon=False)
    thread.start()
    return thread


def backend_of_checkpoint(path: Path) -> str | None:
    """The backend whose checkpoint files end as `path` does, or None."""
    for name, spec in backend_specs().items():
        if Path(path).name.endswith(spec.checkpoint_suffix):
            return name
    return None


def backends_help() -> str:
    """One line per registered backend, for `hydrali --help`: its name, framework and summary."""
    specs = backend_specs()
    width = max(len(name) for name in specs)
    return "\n".join(f"{name:<{width}}  {spec.summary}" for name, spec in sorted(specs.items()))


RENAMED = {  # keys of earlier releases -> the key that took their job
    "backend.replicas": "backend.devices",
}


ADDED = {  # core's config keys added after runs were recorded without them -> the value those runs trained with
    "optim.flat_fraction": 0.75,  # read by schedule=flat_cosine alone, which did not exist before it
}


def added_keys(task: str | None = None, backend: str | None = None) -> dict[str, Any]:
    """Config keys (dotted) added after runs were recorded without them, each with the value such a run was trained
    with: core's (ADDED) and the added_keys of task `task`'s spec and of backend `backend`'s (of every task's or
    backend's where it is not known), so that two tasks (or backends) may declare one key with values of their own."""
    tasks, backends = task_specs(), backend_specs()
    chosen = [tasks[task]] if task in tasks else list(tasks.values())
    chosen += [backends[backend]] if backend in backends else list(backends.values())
    return {**ADDED, **{key: value for spec in chosen for key, value in spec.added_keys.items()}}


def replaced_keys() -> dict[str, str]:
    """Keys that core refuses, each with the key that does its job on every backend: those of earlier releases and
    the backends' own that core decides (their specs' replaced_keys, e.g. a framework's gradient accumulation)."""
    declared = {f"backend.{key}": core for spec in backend_specs().values() for key, core in spec.replaced_keys.items()}
    return {**RENAMED, **declared}
