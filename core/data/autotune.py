"""`pipeline.autotune=true`: a short probe that picks DALI's `num_threads` and `hw_decoder_load` for this machine.

Before training, each process builds its real training pipeline (the recipe, shard, seed, batch and layout the
run will use) at a few candidate settings, runs `autotune_warmup` batches, times `autotune_batches` more, keeps
the fastest, and writes it into `cfg.pipeline` (so the run
trains with it and MLflow logs it as `pipeline.num_threads` / `pipeline.hw_decoder_load`). One log line says
what was chosen against the configured setting.

What a candidate is timed by is `pipeline.autotune_by`: `training` (the default) feeds each candidate's batches to
training steps of a copy of the run's network and optimizer, which the backend builds apart
(`Backend.training_probe`: its precision, compile and layout settings; thrown away before the run builds its own),
so that DALI's decode kernels compete for the GPU's SMs with training as they will in the run; `decode` times the
pipeline alone (GPU outputs waited for before the clock is read), which favours decoding on the SMs.

Every process probes for itself: DALI's threads belong to a process's own pipelines, and under DDP the
processes of a node probe at the same time, so each measures its own pipeline while its neighbours compete for
the cores and decoders as they will in training. The thread candidates stay within the cores this process may
use (os.sched_getaffinity), split between the pipelines of the node that share them.

The search is coordinate-wise, not a grid: on a GPU (mixed decode) first the decoder load with the most
threads, then the threads at the chosen load; on the CPU the threads only. A candidate stops as soon as its
timed batches took longer than the best one's whole window (it cannot win). The probe's pipelines are
separate objects, torn down (and DALI's unused memory released) before training: the run's own pipelines,
seeds and data order are those it would have had without the probe.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from hydrali.core.config.schema import AutotuneBy
from hydrali.core.data.dali_errors import explain_dali_error
from hydrali.core.errors import HydraliError
from hydrali.core.run.contract import backend_settings, contract_on_device

log = logging.getLogger("hydrali")


@dataclass(frozen=True)
class Setting:
    """One candidate: DALI worker threads per pipeline, and the hardware decoder's share (None on the CPU)."""

    num_threads: int
    hw_decoder_load: float | None = None

    def __str__(self) -> str:
        load = "" if self.hw_decoder_load is None else f", hw_decoder_load {self.hw_decoder_load:g}"
        return f"num_threads {self.num_threads}{load}"


@dataclass
class Trial:
    """A setting's measurement: images per second over its timed batches (0 when cut short: it lost)."""

    setting: Setting
    images_per_s: float
    complete: bool = True


@dataclass
class AutotuneResult:
    """The probe's result: the chosen setting, the configured one, and every trial in the order run."""

    chosen: Setting
    configured: Setting
    trials: list[Trial] = field(default_factory=list)
    seconds: float = 0.0
    judge: str = "decode"  # pipeline.autotune_by: what the images/s are of (training steps, or the pipeline alone)

    def rate(self, setting: Setting) -> float | None:
        """Images/s measured for `setting` (None if not measured, or cut short)."""
        rates = [t.images_per_s for t in self.trials if t.setting == setting and t.complete]
        return max(rates) if rates else None

    def line(self) -> str:
        """The one log line: chosen vs configured, and what the probe cost."""
        chosen, configured = self.rate(self.chosen), self.rate(self.configured)
        timed_by = "training steps" if self.judge == "training" else "decoding alone"
        probed = f"{len(self.trials)} settings timed by {timed_by} in {self.seconds:.1f} s"
        if self.chosen == self.configured:
            return f"autotune: keeps {self.chosen} ({chosen or 0:,.0f} images/s, the fastest); {probed}"
        was = f"{configured:,.0f} images/s, {chosen / configured:.2f}x" if chosen and configured else "slower"
        return f"autotune: {self.chosen} ({chosen or 0:,.0f} images/s; configured {self.configured}: {was}); {probed}"


def core_budget(
    pipelines_on_node: int, pipelines_in_process: int, cores: int | None = None, machine_cores: int | None = None
) -> int:
    """The DALI threads one pipeline of this process may use: this process's cores (its affinity) split between
    the pipelines that share them. A launcher that bound the process to some cores (affinity smaller than the
    machine) gave it those for its own pipelines; otherwise the node's pipelines share the whole machine."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    machine_cores = machine_cores if machine_cores is not None else (os.cpu_count() or cores)
    sharing = pipelines_in_process if cores < machine_cores else max(pipelines_on_node, pipelines_in_process)
    return max(1, cores // max(1, sharing))


def thread_candidates(configured: int, budget: int, explicit: Sequence[int] = ()) -> list[int]:
    """The num_threads values to try, ascending, without duplicates, the configured value always among them.
    Automatic (no `explicit` list): the budget, its half, quarter and eighth (at least 1). An explicit
    list is kept within the budget."""
    if any(int(t) < 1 for t in explicit):
        raise HydraliError(f"pipeline.autotune_threads={list(explicit)}: thread counts must be at least 1")
    values = [int(t) for t in explicit if int(t) <= budget] if explicit else [max(1, budget // d) for d in (1, 2, 4, 8)]
    return sorted({*values, int(configured)})


def load_candidates(configured: float, loads: Iterable[float]) -> list[float]:
    """The hw_decoder_load values to try, ascending, without duplicates, the configured value among them."""
    values = [float(v) for v in loads]
    bad = [v for v in [*values, float(configured)] if not 0.0 <= v <= 1.0]
    if bad:
        raise HydraliError(f"pipeline.autotune_loads / hw_decoder_load: {bad[0]:g} is not a share in [0, 1]")
    return sorted({round(v, 4) for v in [*values, float(configured)]})


def pick(trials: Sequence[Trial], prefer: Setting | None = None) -> Setting:
    """The fastest complete trial's setting; a tie (within 1%) goes to `prefer` (the configured setting)."""
    complete = [t for t in trials if t.complete]
    if not complete:
        raise ValueError("no complete trial to pick from")
    best = max(complete, key=lambda t: t.images_per_s)
    for trial in complete:
        if trial.setting == prefer and trial.images_per_s >= 0.99 * best.images_per_s:
            return trial.setting
    return best.setting


@dataclass
class Feed:
    """What a candidate is timed on: `step()` consumes one batch (a pipeline run, or a training step on it), and
    `wait(output)` returns once the work of the step that returned `output` is done (GPU work included)."""

    step: Callable[[], object]
    wait: Callable[[object], None]


def decode_feed(pipe) -> Feed:
    """A pipeline timed alone (pipeline.autotune_by=decode): it is built, and each step is one run; the last batch's
    smallest GPU output is copied back before the clock is read."""
    pipe.build()
    return Feed(pipe.run, _wait_for)


def training_feed(probe) -> Callable[[object], Feed]:
    """Pipelines timed by the training steps they feed (pipeline.autotune_by=training): `probe` is the backend's
    TrainingProbe (hydrali.core.contracts.backend), a copy of the run's network and optimizer."""
    return lambda pipe: Feed(probe.steps_on(pipe), probe.wait)


def measure(
    feed: Feed, *, batch_size: int, warmup: int, batches: int, deadline: float | None = None
) -> tuple[float, bool]:
    """Time `batches` steps of `feed` after `warmup` steps; images/s (the last step waited for before the clock is
    read). With `deadline` (seconds), the timing stops once it is passed. Returns (images/s, complete): 0 and False
    for a timing stopped by its deadline (it lost)."""
    for _ in range(warmup):
        feed.step()
    started = time.perf_counter()
    outputs = None
    for done in range(batches):
        outputs = feed.step()
        if deadline is not None and time.perf_counter() - started > deadline and done + 1 < batches:
            return 0.0, False
    feed.wait(outputs)
    return batches * batch_size / (time.perf_counter() - started), True


def _wait_for(outputs) -> None:
    """Block until the GPU work of a batch is done: copy its smallest GPU output to the host."""
    from nvidia.dali.backend import TensorListGPU

    on_gpu = [out for out in outputs or () if isinstance(out, TensorListGPU)]
    if on_gpu:
        min(on_gpu, key=lambda out: sum(math.prod(int(e) for e in s) for s in out.shape())).as_cpu()


def probe(
    settings: Sequence[Setting],
    build: Callable[[Setting], object],
    *,
    batch_size: int,
    warmup: int,
    batches: int,
    timed_whole: Setting | None = None,
    trials: Sequence[Trial] = (),
    feed: Callable[[object], Feed] = decode_feed,
) -> list[Trial]:
    """Build, time and tear down one pipeline per setting, in order; `build(setting)` returns a pipeline (not yet
    built) and `feed(pipe)` what it is timed on (decode_feed: the pipeline alone). A setting whose timed batches
    pass the best one's whole window (of these or the earlier `trials`) is cut short (incomplete), except
    `timed_whole` (the configured setting: its rate is the baseline of the log line)."""
    done: list[Trial] = list(trials)
    for setting in settings:
        best = max((t.images_per_s for t in done if t.complete), default=0.0)
        deadline = batches * batch_size / best if best and setting != timed_whole else None
        pipe = build(setting)
        timed = None
        try:
            timed = feed(pipe)
            rate, complete = measure(timed, batch_size=batch_size, warmup=warmup, batches=batches, deadline=deadline)
        finally:
            del pipe, timed
            release_memory()
        done.append(Trial(setting, rate, complete))
    return done[len(trials) :]


def release_memory() -> None:
    """Free what deleted pipelines held: their threads (collected now) and DALI's unused pooled memory."""
    gc.collect()
    try:
        from nvidia.dali.backend import ReleaseUnusedMemory

        ReleaseUnusedMemory()
    except (ImportError, RuntimeError):  # an old DALI, or no CUDA to release
        pass


def search(
    configured: Setting,
    threads: Sequence[int],
    loads: Sequence[float] | None,
    build: Callable[[Setting], object],
    *,
    batch_size: int,
    warmup: int,
    batches: int,
    feed: Callable[[object], Feed] = decode_feed,
) -> list[Trial]:
    """Coordinate search: with `loads` (GPU), each load at the most threads, then each thread count at the best
    load; without (CPU), each thread count. Every setting is probed once, timed on `feed`; returns all trials."""
    run = dict(batch_size=batch_size, warmup=warmup, batches=batches, timed_whole=configured, feed=feed)
    if not loads:
        return probe([Setting(t) for t in threads], build, **run)
    trials = probe([Setting(max(threads), load) for load in loads], build, **run)
    best_load = pick(trials, prefer=Setting(max(threads), configured.hw_decoder_load)).hw_decoder_load
    rest = [Setting(t, best_load) for t in threads if t != max(threads)]
    if configured not in {*rest, *(t.setting for t in trials)}:  # measured too: the baseline of the log line
        rest.append(configured)
    return trials + probe(rest, build, trials=trials, **run)


def tune(cfg: DictConfig, task, dataset, plan, backend) -> AutotuneResult:
    """Probe this process's training pipeline (its first replica's shard) at the candidate settings of
    `cfg.pipeline` and return what it found; `cfg` is not changed (see `apply`)."""
    p = cfg.pipeline
    warmup, batches = int(p.autotune_warmup), int(p.autotune_batches)
    if warmup < 0 or batches < 1:
        raise HydraliError(
            f"pipeline.autotune_warmup={warmup}, autotune_batches={batches}: "
            f"the warm-up cannot be negative and at least one batch is timed"
        )
    warmup = max(warmup, int(p.prefetch_queue_depth) + 1)  # batches DALI prepared ahead are never timed
    per_node, _, _ = backend.replicas(backend_settings(cfg.backend, decided=False), plan.device)
    budget = core_budget(per_node, len(plan.shards))
    threads = thread_candidates(int(p.num_threads), budget, list(p.autotune_threads or ()))
    # the hardware decoder's share matters where the pipeline decodes every epoch: not from images decoded once
    gpu = plan.device == "gpu" and not p.options.get("decode_once", False)
    loads = load_candidates(float(p.hw_decoder_load), p.autotune_loads) if gpu else None
    configured = Setting(int(p.num_threads), round(float(p.hw_decoder_load), 4) if gpu else None)
    layout = backend.layout
    shard = plan.shards[0]

    def build(setting: Setting):
        override = {"num_threads": setting.num_threads}
        if setting.hw_decoder_load is not None:
            override["hw_decoder_load"] = setting.hw_decoder_load
        return task.build_pipeline(
            pipeline=OmegaConf.merge(p, override),
            data=cfg.data,
            model=cfg.model,
            dataset=dataset,
            plan=plan,
            shard=shard,
            layout=layout,
            is_training=True,
        )

    started = time.perf_counter()
    judge = AutotuneBy.of(p.autotune_by, "pipeline.autotune_by")
    trainer = training_probe(cfg, task, dataset, plan, backend) if judge is AutotuneBy.training else None
    try:
        trials = search(
            configured,
            threads,
            loads,
            build,
            batch_size=plan.per_replica_batch,
            warmup=warmup,
            batches=batches,
            feed=decode_feed if trainer is None else training_feed(trainer),
        )
    except RuntimeError as err:
        raise explain_dali_error(err, lambda: task.explain_decode_error(dataset)) from err
    finally:
        if trainer is not None:
            trainer.close()
    return AutotuneResult(
        chosen=pick(trials, prefer=configured),
        configured=configured,
        trials=trials,
        seconds=time.perf_counter() - started,
        judge=judge.value,
    )


def training_probe(cfg: DictConfig, task, dataset, plan, backend):
    """The backend's copy of the run's network and optimizer that candidates are timed with; a HydraliError when
    the backend has none (a backend of another package may not declare it)."""
    make = getattr(backend, "training_probe", None)
    if make is None:
        raise HydraliError(
            f"pipeline.autotune_by=training: backend {cfg.backend.name} cannot train a probe: "
            f"pass pipeline.autotune_by=decode"
        )
    device = backend.training_device(backend_settings(cfg.backend, decided=False))
    contract = contract_on_device(cfg, plan, device)
    return make(contract=contract, task=task, dataset=dataset)


def apply(cfg: DictConfig, task, dataset, plan, backend) -> AutotuneResult:
    """Run the probe (`tune`), log its one line, and set the chosen `pipeline.num_threads` (and, on a GPU,
    `pipeline.hw_decoder_load`) in `cfg`, which the run then trains with and logs to MLflow."""
    result = tune(cfg, task, dataset, plan, backend)
    log.info("%s%s", result.line(), f" (rank {plan.global_rank})" if plan.world_size > len(plan.shards) else "")
    with open_dict(cfg):
        cfg.pipeline.num_threads = result.chosen.num_threads
        if result.chosen.hw_decoder_load is not None:
            cfg.pipeline.hw_decoder_load = result.chosen.hw_decoder_load
    return result
