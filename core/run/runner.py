"""One run, start to end, as named stages (`_run` reads them top to bottom): check tracking -> task and data ->
backend -> plan and agreement -> resume point -> launch (several local processes) or tune -> decide (the run
contract) -> accept and track -> fit -> report."""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hydrali.core.config.network_check import check_network
from hydrali.core.config.validate import check_batch_keys, check_config
from hydrali.core.contracts.backend import Backend
from hydrali.core.contracts.registry import backend_spec, load_backend
from hydrali.core.contracts.run import RunContract
from hydrali.core.data import affinity, autotune, devices, image_files, shards_image_size, weights_preprocessing
from hydrali.core.data.image_files import write_skipped_files
from hydrali.core.distributed import agreement, gather, local_launch, topology
from hydrali.core.distributed.launchers import LAUNCHED_BY_HYDRALI
from hydrali.core.distributed.mpi_ranks import adopt_mpi_ranks
from hydrali.core.errors import HydraliError
from hydrali.core.policies import auto_settings, resizing, seeding
from hydrali.core.process import collector, job_context, preemption
from hydrali.core.run import run_dir, wall_time, weights_from_run
from hydrali.core.run.checkpoints import CHECKPOINT_DIR, resolve_checkpoint, write_trained_with
from hydrali.core.run.contract import backend_settings, decided_settings, run_contract
from hydrali.core.run.finished import finished_lines, finished_summary
from hydrali.core.run.plan import Plan, plan_run
from hydrali.core.run.record import RunRecord
from hydrali.core.run.summary import build_summary, format_table, read_summary, write_summary
from hydrali.core.run.wall_time import BUILD, DATA_CHECK, STARTUP, TRACKING, RunClock
from hydrali.core.tracking import mlflow_runs as tracking
from hydrali.core.tracking import sweep
from hydrali.core.tracking.run_files import accept_run

log = logging.getLogger("hydrali")


def build_plan(cfg: DictConfig, backend: Backend, dataset, seed: int) -> Plan:
    """The plan of this process: topology from the environment, batch and lr rules, seeds, epoch steps."""
    device = devices.resolve_device(
        str(cfg.pipeline.device), backend.visible_gpus(), backend_spec(cfg.backend.name).framework_label
    )
    settings = backend_settings(cfg.backend, decided=False)
    per_node, nodes, per_process = backend.replicas(settings, device)
    spec = backend_spec(cfg.backend.name)
    local_launch.check_sweep_launch(
        spec.name, per_node, per_process * backend.processes_to_start(settings), spec.sweep_launch_hint
    )
    topo = topology.detect_topology(per_node, nodes, replicas_per_process=per_process)
    return plan_run(cfg, topo, dataset, seed=seed, device=device)


def _prepare_data(cfg: DictConfig, task):
    """The task's dataset, its image files checked once per run: in a process hydrali started, by the job's own
    process (its result taken, so that with data.bad_files=skip every process leaves out the same files); under
    torchrun or srun by the first process, and with data.bad_files=skip by every one (none has the others' result)."""
    if os.environ.get(LAUNCHED_BY_HYDRALI):
        checked = local_launch.checked_by_job(Path(cfg.paths.output_dir))
        if checked is not None:
            with image_files.checked_already(checked):
                return task.prepare_data(cfg.data, verify=cfg.data.verify)
    checks = topology.is_first_process() or str(cfg.data.get("bad_files", "fail")) == "skip"
    return task.prepare_data(cfg.data, verify=cfg.data.verify if checks else "off")


def run(cfg: DictConfig) -> float | None:
    """Train and evaluate as `cfg` says; return the value of `optimized_metric` (for sweepers)."""
    launched = bool(os.environ.get(LAUNCHED_BY_HYDRALI))  # a process of a job whose own process holds the dir
    clock = RunClock(wall_time.run_started(whole_process=launched))  # from this process's start where it is the run's
    adopt_mpi_ranks()  # mpirun's ranks, as torchrun's variables (the frameworks read those), before anything can fail:
    # a failed job is then recorded by rank 0 alone (sweep.run_job asks is_first_process)
    check_config(cfg)
    shards_image_size.apply(cfg)  # data=webdataset: the shards' image size where the config leaves it null
    # the pretrained weights' image size, mean and std, before the run dir compares configs or anything reads them
    weights_preprocessing.apply(cfg, job_context.current().overrides)
    weights_from_run.adopt(cfg, job_context.current().overrides)  # a run's network settings with its weights
    resizing.check(cfg)  # against data.image_size as the weights set it
    check_network(cfg)  # e.g. a model name not in its library's registry: one line, before the run dir is touched
    output_dir = Path(cfg.paths.output_dir)
    # a preemption signal is noted from here on: during the set-up, the run stops after its first training step
    with (
        preemption.watching(cfg.preemption) as watch,
        run_dir.claim(output_dir, hold=topology.is_first_process() and not launched),
    ):
        job = job_context.current()
        if launched:  # its config is the job's, resolved by the job's process
            attempt = run_dir.Attempt(cfg, list(job.overrides), run_dir.read(output_dir))
        else:
            attempt = run_dir.reconcile(cfg, output_dir, list(job.overrides))
            shards_image_size.apply(attempt.cfg)  # a config composed again (ckpt_path)
            weights_preprocessing.apply(attempt.cfg, attempt.overrides)
            weights_from_run.adopt(attempt.cfg, attempt.overrides)
            check_config(attempt.cfg)
            check_batch_keys(attempt.cfg, attempt.overrides)  # the run's config: a resumed run's recomposed one
            finished = finished_summary(attempt)
            if finished is not None:  # the same command again: nothing to train, nothing written
                return report_finished(attempt.cfg, finished)
        try:
            return _run(attempt, clock, watch)
        except preemption.Preempted as stop:
            if not launched:  # the job's own process requeues it, once
                watch.hand_over(stop, first_process=topology.is_first_process())
            raise


def report_finished(cfg: DictConfig, summary: dict) -> float | None:
    """A finished run asked for again: say so, with its summary's headline, and return its value of
    `optimized_metric` (a sweeper counts the job as it did)."""
    for line in finished_lines(summary, Path(cfg.paths.output_dir)):
        print(line, flush=True)
    return _optimized_value(summary, cfg.optimized_metric)


def _run(attempt: run_dir.Attempt, clock: RunClock, watch: preemption.PreemptionWatch) -> float | None:
    """The run's stages, in order: each takes what the ones before it decided and returns what it decides. `clock`
    times the parts of the run's wall time that the summary reports (core/run/wall_time.py)."""
    cfg = attempt.cfg
    clock.add(STARTUP, clock.since_start())
    gather.install(None)  # the collective of an earlier job of this process goes; this run's backend installs its own
    with clock.timing(TRACKING):
        check_tracking(cfg)
    with clock.timing(DATA_CHECK):
        task = instantiate(cfg.task)
        with image_files.remembering(cfg.paths.get("cache_dir")) as checked:  # files unchanged since they passed
            dataset = _prepare_data(cfg, task)  # before the backend loads, so that bad data fails in a second
    with clock.timing(STARTUP):  # its framework's imports
        backend = load_backend(cfg.backend.name)
        collector.frameworks_loaded()  # the collector resumes, without the frameworks' objects (process/collector.py)
    plan, task = plan_and_agree(cfg, backend, task, dataset)
    start = resume_point(attempt, cfg, backend, dataset)
    plan = seeded_for(plan, start, cfg)
    processes = backend.processes_to_start(backend_settings(cfg.backend, decided=False))
    if processes > 1:  # the job's processes, started from its resolved config (one seed, one run dir)
        _, nodes, _ = backend.replicas(backend_settings(cfg.backend, decided=False), plan.device)
        value = launch(cfg, processes, nodes, plan, dataset, attempt.overrides, watch)
        checked.keep()  # the job ran: the files that passed are kept for later runs
        return value
    with clock.timing(BUILD):  # pipeline.autotune's probes
        asked = tune(cfg, backend, task, dataset, plan)
    contract = decide(cfg, backend, plan)
    with clock.timing(TRACKING):
        tracker = accept_and_track(asked, contract, attempt)
    checked.keep()  # the run is accepted: the files that passed are kept for later runs
    record = RunRecord.open(
        Path(cfg.paths.output_dir),
        tracker,
        resume=start.checkpoint is not None,
        writer=plan.global_rank == 0,
        epochs=cfg.epochs,
    )
    result = fit_tracked(cfg, contract, backend, task, dataset, start, tracker, record, watch, clock)
    if plan.global_rank != 0:
        return None
    if result.best_checkpoint:  # the epochs it holds, as the backend reads its checkpoints (for the summary only)
        try:
            result.best_checkpoint_epoch = backend.checkpoint_epochs(Path(result.best_checkpoint))
        except (HydraliError, OSError) as err:
            log.warning("the best checkpoint's epoch is unknown (%s): the summary leaves it out", err)
    return report(cfg, result, record, plan, tracker, clock)


def check_tracking(cfg: DictConfig) -> None:
    """A tracking server named by tracking.uri answers, within seconds, before anything is loaded (rank 0)."""
    if cfg.tracking.enabled and cfg.tracking.uri and topology.is_first_process():
        tracking.configure_http(cfg.tracking.timeout_s, cfg.tracking.retries)
        tracking.check_reachable(cfg.tracking.uri, cfg.tracking.timeout_s)


def plan_and_agree(cfg: DictConfig, backend: Backend, task, dataset) -> tuple[Plan, object]:
    """This process's plan, with the run dir and seed rank 0 chose where a launcher started the processes (torchrun,
    srun, TF_CONFIG): cfg.paths.output_dir is then rank 0's, and the task is built again for it. (plan, task)"""
    plan = build_plan(cfg, backend, dataset, seeding.resolve_seed(cfg.seed))
    if agreement.needed(plan.world_size // len(plan.shards)):
        output_dir = Path(cfg.paths.output_dir)
        agreed = agreement.agree(backend.share_from_rank0, agreement.StartValues(str(output_dir), plan.seed), plan)
        agreement.move_to_run_dir(output_dir, Path(agreed.output_dir), plan.global_rank)
        cfg.paths.output_dir = agreed.output_dir
        task = instantiate(cfg.task)  # its paths (e.g. detection's pictures_dir) in the agreed run dir
        if agreed.seed != plan.seed:  # a seed drawn by this rank (seed=null): rank 0's instead
            plan = build_plan(cfg, backend, dataset, agreed.seed)
    if cfg.seed is None and plan.global_rank == 0:
        seeding.announce_drawn(plan.seed)
    return plan, task


@dataclass(frozen=True)
class StartPoint:
    """Where training starts: the checkpoint it resumes from (None: from the start) and the whole epochs it holds,
    and what decides the shapes of its weights (written beside the checkpoints of a fresh run)."""

    checkpoint: Path | None
    trained_with: dict
    epochs: int = 0


def resume_point(attempt: run_dir.Attempt, cfg: DictConfig, backend: Backend, dataset) -> StartPoint:
    """The checkpoint this run resumes from: ckpt_path's, or, for the same run started again in its dir (a requeued
    job), its newest (cfg.ckpt_path becomes `last`); model.weights naming an earlier run is checked when none."""
    output_dir = Path(cfg.paths.output_dir)
    trained_with = _trained_with(cfg, dataset)
    if attempt.run_file is not None and cfg.ckpt_path is None:
        if backend.newest_checkpoint(output_dir / CHECKPOINT_DIR) is not None:
            log.info("%s holds this run, with the same settings: resuming from its newest checkpoint", output_dir)
            cfg.ckpt_path = "last"
    resumed = resolve_checkpoint(
        cfg.ckpt_path,
        output_dir,
        cfg.backend.name,
        backend.newest_checkpoint,
        backend.checkpoint_epochs,
        cfg.epochs,
        trained_with,
    )
    if resumed is None:  # model.weights naming an earlier run: of this backend, task and network
        weights_from_run.check(cfg, backend.newest_checkpoint)
        return StartPoint(None, trained_with)
    checkpoint, epochs = resumed
    return StartPoint(checkpoint, trained_with, epochs)


def seeded_for(plan: Plan, start: StartPoint, cfg: DictConfig) -> Plan:
    """The plan whose DALI pipelines start at the resumed epoch: seeded for it, unless the backend restores DALI's
    reader position from the checkpoint (pipeline.checkpointing), which carries on the interrupted stream."""
    restores = backend_spec(cfg.backend.name).resumes_reader_position and bool(cfg.pipeline.get("checkpointing"))
    return plan if start.epochs == 0 or restores else plan.resumed_at(start.epochs)


def launch(cfg: DictConfig, processes: int, nodes: int, plan: Plan, dataset, overrides, watch) -> float | None:
    """Start the job's `processes` on this node (one of its `nodes`) from its resolved config (one seed, one run dir)
    and wait for them; the job's value from the summary its rank 0 wrote."""
    local_launch.run_processes(
        cfg,
        processes,
        nodes,
        plan.seed,
        overrides,
        preemption=watch,
        bad_files=getattr(dataset, "skipped", ()),  # this process's check of the files: the processes' own
    )
    return _optimized_value(read_summary(Path(cfg.paths.output_dir)), cfg.optimized_metric)


def tune(cfg: DictConfig, backend: Backend, task, dataset, plan: Plan) -> DictConfig:
    """Pin DALI's workers, let pipeline.autotune choose its settings into cfg, seed everything and log the plan.
    Returns the settings as asked: what run.json and .hydra/ keep and what the same command started again in this
    dir is compared with (what this attempt decides by itself, autotune's choice, is its own)."""
    per_node, _, per_process = backend.replicas(backend_settings(cfg.backend, decided=False), plan.device)
    affinity.pin_workers(cfg.pipeline, plan, per_node // max(1, per_process))  # before any pipeline is built
    asked = copy.deepcopy(cfg)
    if cfg.pipeline.autotune:  # every process probes its own DALI pipeline; the choice goes into cfg (and MLflow)
        autotune.apply(cfg, task, dataset, plan, backend)
    use_cpu_threads(cfg, backend, plan, per_node // max(1, per_process))  # DALI's workers as autotune chose them
    seeding.seed_everything(plan.seed)
    log.info(describe_plan(plan, cfg.optim.ref_batch))
    return asked


def use_cpu_threads(cfg: DictConfig, backend: Backend, plan: Plan, processes_on_node: int) -> None:
    """Give the backend's framework the compute threads core decides (cpu_threads), logged; none when it decides
    nothing (a GPU run under auto, or the caller's own thread variables)."""
    share = affinity.process_share(
        list(os.sched_getaffinity(0)), os.cpu_count() or 1, plan.local_rank, max(1, processes_on_node)
    )
    threads = affinity.framework_threads(
        cfg.cpu_threads, plan.device, int(cfg.pipeline.num_threads), len(plan.shards), len(share)
    )
    if threads is not None:
        backend.use_cpu_threads(threads)
        log.info(
            "cpu_threads: %d compute thread(s) for the framework (%d core(s), %d DALI worker(s) per pipeline)",
            threads,
            len(share),
            int(cfg.pipeline.num_threads),
        )


def describe_plan(plan: Plan, ref_batch: int) -> str:
    """The plan in one log line: replicas, batches, lr rule, seed, shards, device, steps."""
    accumulated = f" x {plan.accumulate} accumulated" if plan.accumulate > 1 else ""
    return (
        f"plan: {plan.world_size} replica(s) x batch {plan.per_replica_batch}{accumulated} = global batch "
        f"{plan.global_batch}; lr {plan.base_lr:g} x {plan.lr_scale_rule}({plan.global_batch}/{ref_batch}) = "
        f"{plan.effective_lr:g}; seed {plan.seed}; rank {plan.global_rank} reads shard "
        f"{','.join(str(s.shard_id) for s in plan.shards)}/{plan.num_shards}, DALI on {plan.device}; "
        f"{plan.epoch.train_steps} steps per epoch"
    )


def decide(cfg: DictConfig, backend: Backend, plan: Plan) -> RunContract:
    """Resolve the `auto` settings for the device this process trains on (logged in one line) and build the run
    contract the backend trains by: every decision is made from here on."""
    training_device = backend.training_device(backend_settings(cfg.backend, decided=False))
    decided = auto_settings.resolve(cfg, training_device)
    if decided and plan.global_rank == 0:
        log.info(auto_settings.describe(decided, training_device))
    contract = run_contract(cfg, plan)
    if contract.train_sizes and plan.global_rank == 0:
        log.info("progressive_resizing: training images at %s", resizing.describe(contract.train_sizes))
    return contract


def accept_and_track(asked: DictConfig, contract: RunContract, attempt: run_dir.Attempt):
    """The checks passed: write the run dir's config (at the run's first start), open the MLflow run (the same one
    for a resumed run) and write run.json: the settings as asked, and what this attempt decided (the contract).
    The tracker."""
    output_dir, rank = Path(asked.paths.output_dir), contract.plan.global_rank
    accept_run(asked, output_dir, write_config=rank == 0 and attempt.run_file is None)
    tracker = tracking.start_tracking(
        enabled=asked.tracking.enabled,
        is_global_zero=rank == 0,
        uri=asked.tracking.uri,
        experiment=asked.tracking.experiment,
        artifact_location=asked.tracking.artifact_location,
        output_dir=output_dir,
        run_name=f"{asked.task.name}-{asked.backend.name} {output_dir.name}",
        sweep_dir=job_context.current().sweep_dir,
        run_id=attempt.run_file.mlflow_run_id if attempt.run_file is not None else None,
        tags=sweep.job_tags(),
    )
    if rank == 0:
        run_file = run_dir.run_file_of(asked, attempt.overrides, tracker.run_id, decided_settings(contract))
        run_dir.write(output_dir, run_file)
    return tracker


def fit_tracked(
    cfg, contract: RunContract, backend: Backend, task, dataset, start: StartPoint, tracker, record, watch, clock
):
    """Log the run's params (its decided settings) and files to its tracker, train through the backend (`clock`
    notes when, and the tracking's time), log the best checkpoint and the task's artifacts; the MLflow run ends
    FINISHED, FAILED or KILLED (preempted: KILLED until it resumes)."""
    output_dir, plan = Path(cfg.paths.output_dir), contract.plan
    status = "FAILED"
    try:
        with clock.timing(TRACKING):
            _log_run_start(cfg, plan, dataset, start, tracker)
        clock.fit_starts()
        result = backend.fit(
            contract=contract,
            task=task,
            dataset=dataset,
            record=record,
            resume_from=start.checkpoint,
            output_dir=output_dir,
            preemption=watch,
        )
        with clock.timing(TRACKING):
            _log_run_end(cfg, result, task, tracker)
        status = "FINISHED"
        return result
    except (KeyboardInterrupt, SystemExit):
        status = "KILLED"
        raise
    except preemption.Preempted:
        status = "KILLED"  # until the job, started again, resumes it (RUNNING, then FINISHED)
        tracker.finish(status)
        status = None
        raise  # run() hands the job over (submitit's requeue, or scontrol requeue)
    finally:
        if status is not None:
            with clock.timing(TRACKING):
                tracker.finish(status)


def _log_run_start(cfg: DictConfig, plan: Plan, dataset, start: StartPoint, tracker) -> None:
    """The run's params (its decided settings), config and overrides to its tracker; trained_with.json (a fresh
    run) and the files the data check left out beside the checkpoints."""
    output_dir = Path(cfg.paths.output_dir)
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    tracker.log_params({**tracking.flatten(resolved), **plan.params(), **dataset.params()})
    tracker.log_text(OmegaConf.to_yaml(resolved), "config/config.yaml")
    tracker.log_text("\n".join(job_context.current().overrides) + "\n", "config/overrides.txt")
    if plan.global_rank == 0 and start.checkpoint is None:
        write_trained_with(output_dir, start.trained_with)
    skipped = getattr(dataset, "skipped", ())  # a task of an installed package may not leave files out
    if plan.global_rank == 0 and skipped:
        tracker.log_artifact(write_skipped_files(output_dir, skipped))


def _log_run_end(cfg: DictConfig, result, task, tracker) -> None:
    """The best checkpoint (tracking.log_checkpoint) and the task's artifacts to the run's tracker."""
    if cfg.tracking.log_checkpoint and result.best_checkpoint:
        tracker.log_artifact(result.best_checkpoint, "checkpoints")
    for path, folder in task.artifacts():
        tracker.log_artifact(path, folder)


def report(cfg: DictConfig, result, record: RunRecord, plan: Plan, tracker, clock: RunClock) -> float | None:
    """Rank 0: tag the MLflow run with the job's objective (for a sweep's summary), then write summary.json (with
    the parts of the run's wall time, from `clock` and `result`) and print the end-of-run table; the value of
    `optimized_metric`."""
    output_dir = Path(cfg.paths.output_dir)
    wall_seconds = clock.since_start()
    summary = build_summary(
        result=result,
        record=record,
        plan=plan,
        monitor=cfg.task.monitor,
        mode=str(cfg.task.mode),
        wall_seconds=wall_seconds,
        wall_parts=wall_time.wall_parts(clock, result, wall_seconds),
        run_id=tracker.run_id,
        tracking_uri=tracker.uri,
        output_dir=output_dir,
        task=cfg.task.name,
        backend=cfg.backend.name,
    )
    value = _optimized_value(summary, cfg.optimized_metric)
    if value is not None:  # for the sweep's summary (hydrali.core.tracking.sweep_report)
        tracker.set_tags(
            {
                sweep.OBJECTIVE_TAG: value,
                sweep.OBJECTIVE_NAME_TAG: cfg.optimized_metric,
                sweep.OBJECTIVE_MODE_TAG: str(cfg.task.mode),
            }
        )
    # last: a run whose dir holds summary.json is recorded whole, which the same command started again relies on
    write_summary(summary, output_dir)
    print(format_table(summary), flush=True)
    return value


def _trained_with(cfg: DictConfig, dataset) -> dict:
    """What decides the shapes of a run's weights and optimizer state: a checkpoint resumes only under the same."""
    return {
        "task": cfg.task.name,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "num_classes": dataset.num_classes,
        # what each output of the head means (hydrali eval and predict name and check them); absent from records
        #   written before it existed, which resume as they are
        **({"classes": list(classes)} if (classes := getattr(dataset, "classes", None)) is not None else {}),
        "optim": str(cfg.optim.name),
        # the optimizer's parameter groups (and their lrs, which a checkpoint restores) follow it: kept only when
        # it is not 1, so that records written before it existed still compare equal
        **({"backbone_lr_mult": mult} if (mult := float(cfg.optim.get("backbone_lr_mult", 1.0))) != 1.0 else {}),
        # a weight average adds to the optimizer's state (Keras) and the checkpoint's (torch): kept only when on
        **({"ema": True} if cfg.optim.get("ema_decay") is not None else {}),
    }


def _optimized_value(summary: dict, metric: str) -> float | None:
    if summary["best"].get(metric) is not None:
        return summary["best"][metric]
    return summary["final"].get(metric)
