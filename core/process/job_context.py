"""Which job this process runs: its command-line overrides and, under -m, its number and the sweep's dir.

Read from Hydra in the process Hydra started; in the processes hydrali starts for a job
(hydrali.core.distributed.local_launch) it is the job's, saved by the job's process and set with `adopt`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class JobContext:
    """The job as Hydra launched it."""

    overrides: list[str] = field(default_factory=list)
    num: str | None = None  # the job's number under -m (hydra.job.num), else None
    sweep_dir: str | None = None  # the sweep's dir under -m (hydra.sweep.dir), else None

    @property
    def in_sweep(self) -> bool:
        """Whether the job is one of a sweep's (-m)."""
        return self.num is not None

    def to_dict(self) -> dict:
        """The context as plain data (to save it for the job's other processes)."""
        return asdict(self)


_adopted: dict = {"context": None}


def adopt(context: JobContext) -> None:
    """Make `context` this process's job (a process hydrali started for a job)."""
    _adopted["context"] = context


def current() -> JobContext:
    """This process's job: adopted, or read from Hydra (an empty context outside Hydra)."""
    if _adopted["context"] is not None:
        return _adopted["context"]
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return JobContext()
    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    if hc.mode != RunMode.MULTIRUN:
        return JobContext(overrides=overrides)
    return JobContext(overrides=overrides, num=str(hc.job.num), sweep_dir=str(hc.sweep.dir))
