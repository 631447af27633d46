"""What DDP itself scales to on this machine, without hydrali's Trainer around it: the run's network, optimizer and
precision (the Lightning backend's probe, backends/lightning/probe.py) in torch's DistributedDataParallel, one
process per GPU, trained by a plain loop on batches already on the GPU ("tensors") or fed by each rank's DALI
shard ("dali"), or on the first batch while DALI keeps producing (and dropping) the next ones ("dali_discard":
DALI's GPU work beside DDP, without its batches), on 1 GPU and on N. Prints one line per measurement and the ratio
N / 1.

    python3 -m hydrali.bench.gpu.torch_ddp_bound --gpus 2 --feed tensors dali -- data=imagefolder data.root=DIR

The same config as `hydrali` (its overrides after `--`); run on the GPU machine (bench/gpu/scaling.sh).
"""

from __future__ import annotations

import argparse
import ast
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TRACED_STEPS = 5  # steps traced per rank with --trace


class TrainingLoss(torch.nn.Module):
    """The task side's training loss as a forward pass, so that DDP's hooks see the whole step."""

    def __init__(self, torch_task: torch.nn.Module):
        super().__init__()
        self.torch_task = torch_task

    def forward(self, batch: dict) -> torch.Tensor:
        return self.torch_task.training_loss(batch)[0]


def _compose(overrides: list[str]):
    """hydrali's config for `overrides`, as `hydrali` composes it (HydraConfig set: paths resolve from it)."""
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from hydrali.core.config.store import register_schemas

    register_schemas()
    with initialize_config_module("hydrali.conf", version_base="1.3"):
        cfg = compose("config", overrides=["hydra.run.dir=/tmp/ddp_bound", *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def _rank(rank, world, port, feed, overrides, warmup, steps, results, device: str, trace: str | None, extra: dict):
    from hydra.utils import instantiate

    import hydrali.tasks.base as task_base
    from hydrali.backends.lightning.probe import LightningProbe
    from hydrali.backends.torch.loaders import dali_loader
    from hydrali.bench.torch_loops import probe_contract
    from hydrali.core.distributed.topology import detect_topology
    from hydrali.core.run.plan import plan_run

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if extra["dali"]:  # DALI Pipeline arguments beside the recipe's (exec_dynamic=True, ...): every pipeline built here
        build = task_base.make_pipeline
        task_base.make_pipeline = lambda *args, **kwargs: build(*args, **kwargs, **extra["dali"])
    if extra.get("decoder"):  # every recipe's GPU image decoder takes these beside hydrali's (preallocation hints, ...)
        _extend_decoder_args(extra["decoder"])
    gpu = device == "gpu"
    if gpu:
        torch.cuda.set_device(rank)
        if extra.get("side_stream"):  # training (and DALI's copies into it) on a stream of torch's, not the legacy one
            torch.cuda.set_stream(torch.cuda.Stream(priority=extra.get("stream_priority", 0)))
    if world > 1:
        dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)
    cfg = _compose(overrides)
    task = instantiate(cfg.task)
    dataset = task.prepare_data(cfg.data, verify="off")
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}
    plan = plan_run(cfg, detect_topology(world, 1, env=env), dataset, seed=0, device=device)
    contract = probe_contract(cfg, plan)
    probe = LightningProbe(contract=contract, task=task, dataset=dataset)
    model = TrainingLoss(probe.torch_task)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if gpu else None, **extra["ddp"])
    loader = dali_loader(task=task, contract=contract, dataset=dataset, is_training=True)
    if feed == "tensors":
        first = next(iter(loader))
        batches = iter(lambda: first, None)
    elif feed == "dali_discard":
        first = next(iter(loader))
        produced = (batch for _ in iter(int, 1) for batch in loader)
        batches = ((next(produced), first)[1] for _ in iter(int, 1))
    else:
        batches = (batch for _ in iter(int, 1) for batch in loader)

    def step():
        with probe.precision.forward_context():
            loss = model(next(batches))
        probe.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        probe.optimizer.step()

    for _ in range(warmup):
        step()
    wait = torch.cuda.synchronize if gpu else (lambda: None)
    wait()
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    wait()
    seconds = time.perf_counter() - start
    if extra.get("backtraces"):  # a few more steps, the native stacks of the named CUDA calls recorded (rank 0's shown)
        from hydrali.bench.gpu.cuda_backtraces import CallRecorder

        recorder = CallRecorder(set(extra["backtraces"]))
        recorder.start()
        for _ in range(TRACED_STEPS):
            step()
        wait()
        recorder.stop()
        if rank == 0:
            print(f"backtraces of rank 0, {world} GPU(s), {TRACED_STEPS} steps:\n{recorder.report()}", flush=True)
    elif trace:  # a few more steps under torch's profiler: one Chrome trace per rank (CPU and CUDA timelines)
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if gpu else [])]
        with profile(activities=activities) as prof:
            for _ in range(TRACED_STEPS):
                step()
            wait()
        os.makedirs(trace, exist_ok=True)
        prof.export_chrome_trace(os.path.join(trace, f"{extra['tag']}{feed}-{world}gpu-rank{rank}.json"))
    if rank == 0:
        results.put(world * plan.per_replica_batch * steps / seconds)
    if world > 1:
        dist.destroy_process_group()


def _extend_decoder_args(extra_args: dict) -> None:
    """Every recipe's mixed (GPU) image decoder takes `extra_args` beside hydrali's arguments (this process only)."""
    import hydrali.core.data.pipelines as pipelines
    import hydrali.tasks.classification.recipes as classification
    import hydrali.tasks.detection.recipes as detection

    base = pipelines.decoder_args

    def decoder_args(device: str, hw_decoder_load: float) -> dict:
        return {**base(device, hw_decoder_load), **(extra_args if device == "gpu" else {})}

    classification.decoder_args = detection.decoder_args = decoder_args


def measure(
    world: int,
    feed: str,
    overrides: list[str],
    warmup: int,
    steps: int,
    device: str = "gpu",
    trace: str | None = None,
    extra: dict | None = None,
) -> float:
    """Images/s of all `world` GPUs (or CPU processes) together, DDP over them, fed as `feed` says; with `trace`, a
    Chrome trace of a few more steps per rank is written into that folder (its names begin with extra["tag"]);
    extra["ddp"]: arguments of DistributedDataParallel, extra["dali"]: arguments of every DALI Pipeline,
    extra["decoder"]: arguments of every GPU image decoder."""
    extra = extra or {"ddp": {}, "dali": {}, "tag": ""}
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    port = 29500 + os.getpid() % 1000
    mp.start_processes(
        _rank,
        args=(world, port, feed, overrides, warmup, steps, results, device, trace, extra),
        nprocs=world,
        start_method="spawn",
    )
    return results.get()


def _keyword_args(pairs: list[str]) -> dict:
    """{KEY: value} of KEY=VALUE strings, each value a Python literal."""
    return {key: ast.literal_eval(value) for key, _, value in (pair.partition("=") for pair in pairs)}


def main() -> None:
    """Measure DDP on 1 GPU and on --gpus, per feed, repeated and interleaved; print each and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--feed", nargs="+", default=["tensors", "dali"], choices=["tensors", "dali", "dali_discard"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", default="gpu", choices=["gpu", "cpu"], help="cpu: gloo processes (a dry run)")
    parser.add_argument("--trace", help="a folder: a torch profiler trace (Chrome JSON) of a few steps per rank")
    parser.add_argument("--bucket-cap-mb", type=float, help="DDP's gradient bucket size (torch's default: 25)")
    parser.add_argument("--static-graph", action="store_true", help="DDP's static_graph=True")
    parser.add_argument("--dali-arg", action="append", default=[], help="KEY=VALUE, every DALI Pipeline's")
    parser.add_argument("--decoder-arg", action="append", default=[], help="KEY=VALUE, every GPU image decoder's")
    parser.add_argument("--side-stream", action="store_true", help="train on a stream of its own, not CUDA's default")
    parser.add_argument(
        "--backtraces",
        nargs="+",
        default=[],
        help="CUDA runtime calls (cudaDeviceSynchronize, ...): "
        "the native stacks of their callers over a few more steps, instead of --trace",
    )
    parser.add_argument("--stream-priority", type=int, default=0, help="--side-stream's CUDA priority (-1: high)")
    parser.add_argument("--tag", default="", help="a prefix of the trace files' names")
    parser.add_argument("overrides", nargs="*", help="hydrali overrides (after --)")
    args = parser.parse_args()
    ddp_kwargs = {"bucket_cap_mb": args.bucket_cap_mb} if args.bucket_cap_mb else {}
    ddp_kwargs.update({"static_graph": True} if args.static_graph else {})
    dali_kwargs, decoder_kwargs = (_keyword_args(pairs) for pairs in (args.dali_arg, args.decoder_arg))
    extra = {"ddp": ddp_kwargs, "dali": dali_kwargs, "decoder": decoder_kwargs, "tag": args.tag}
    extra.update(side_stream=args.side_stream, stream_priority=args.stream_priority, backtraces=args.backtraces)
    rates: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for feed in args.feed:
            for world in (1, args.gpus):
                rate = measure(world, feed, args.overrides, args.warmup, args.steps, args.device, args.trace, extra)
                rates.setdefault((feed, world), []).append(rate)
                print(f"ddp_bound: {feed:7s} {world} GPU(s): {rate:,.0f} images/s", flush=True)
    for feed in args.feed:
        one, many = (sorted(rates[(feed, w)])[len(rates[(feed, w)]) // 2] for w in (1, args.gpus))
        print(f"ddp_bound: {feed:7s} median {one:,.0f} on 1 GPU, {many:,.0f} on {args.gpus}: {many / one:.2f}x")


if __name__ == "__main__":
    main()
