"""DDP and CUDA streams on a 2-GPU machine: what building DistributedDataParallel on a side stream costs, and whether
hydrali's DDP runs train the weights a fully synchronized run trains.

    python3 -m hydrali.bench.gpu.ddp_streams speed     # plain torch DDP of ResNet-50 (bf16, batch 256 a GPU): the
                                                       #   wrapper built on a side stream (Lightning's DDPStrategy)
                                                       #   against the current stream (hydrali's), interleaved
    python3 -m hydrali.bench.gpu.ddp_streams weights   # hydrali (Lightning, 2 GPUs, deterministic=true, bundled
                                                       #   digits) as it runs and with CUDA_LAUNCH_BLOCKING=1 (every
                                                       #   launch synchronous): the same weights, no stream warning

Each prints a table last. Run after bench/gpu/env.sh (../shared/device/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

STREAM_WARNING = "AccumulateGrad node's stream does not match"
WORLD = 2


def _rank(rank: int, variant: str, steps: int, warmup: int, batch: int, port: int, result_file: str) -> None:
    """One rank of the speed measurement: ResNet-50 under DDP built as `variant` says, synthetic batches on the GPU;
    rank 0 writes images/s (all ranks) and whether torch warned of the stream mismatch."""
    import torch
    import torch.distributed as dist
    import torchvision

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    if variant == "side":  # as Lightning's DDPStrategy._setup_model
        with torch.cuda.stream(torch.cuda.Stream()):
            ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    images = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(warmup + steps):
            if step == warmup:
                torch.cuda.synchronize()
                start = torch.cuda.Event(enable_timing=True)
                start.record()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(ddp(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    warned = any(STREAM_WARNING in str(w.message) for w in caught)
    if rank == 0:
        Path(result_file).write_text(
            json.dumps({"images_per_second": WORLD * batch * steps / seconds, "warned": warned})
        )
    dist.destroy_process_group()


def speed(repeats: int, steps: int, warmup: int, batch: int) -> int:
    """Interleaved repeats of both variants; the table of their images/s."""
    import torch.multiprocessing as mp

    measured: dict[str, list[dict]] = {"side": [], "current": []}
    for repeat in range(repeats):
        for variant in measured:
            with tempfile.NamedTemporaryFile(suffix=".json") as result:
                port = 29500 + 2 * repeat + (variant == "side")
                mp.spawn(_rank, args=(variant, steps, warmup, batch, port, result.name), nprocs=WORLD, join=True)
                measured[variant].append(json.loads(Path(result.name).read_text()))
                print(f"ddp_streams: repeat {repeat + 1} {variant}: {measured[variant][-1]}", flush=True)
    side = statistics.median(m["images_per_second"] for m in measured["side"])
    current = statistics.median(m["images_per_second"] for m in measured["current"])
    print(f"\n| DDP built on | images/s (median of {repeats}, {WORLD} GPUs) | stream warning |\n| --- | --- | --- |")
    print(f"| a side stream (Lightning) | {side:,.0f} | {any(m['warned'] for m in measured['side'])} |")
    print(f"| the current stream (hydrali) | {current:,.0f} | {any(m['warned'] for m in measured['current'])} |")
    print(f"current / side: {current / side:.3f}")
    return 0


def _hydrali_run(run_dir: Path, blocking: bool, epochs: int) -> tuple[int, str]:
    """A 2-GPU deterministic Lightning run of the bundled digits; (exit code, log)."""
    env = {**os.environ, **({"CUDA_LAUNCH_BLOCKING": "1"} if blocking else {})}
    command = [
        sys.executable,
        "-m",
        "hydrali.core",
        "backend.devices=2",
        "deterministic=true",
        f"epochs={epochs}",
        "tracking=none",
        "progress_bar=false",
        f"hydra.run.dir={run_dir}",
    ]
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    return out.returncode, out.stdout + out.stderr


def weights(epochs: int) -> int:
    """The same run with and without every launch synchronous: equal weights and no stream warning, or exit 1."""
    import torch

    work = Path(tempfile.mkdtemp(prefix="ddp-streams-"))
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    states, warned = {}, {}
    for blocking in (False, True):
        run_dir = work / ("blocking" if blocking else "as-run")
        code, log = _hydrali_run(run_dir, blocking, epochs)
        (out / f"ddp_streams_{run_dir.name}.log").write_text(log)
        if code != 0:
            print(log[-3000:])
            return 1
        warned[blocking] = STREAM_WARNING in log
        checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        states[blocking] = checkpoint["state_dict"]
    differing = [k for k in states[False] if not torch.equal(states[False][k], states[True][k])]
    print(f"\n| run (Lightning, 2 GPUs, deterministic, {epochs} epoch(s)) | stream warning | tensors |")
    print("| --- | --- | --- |")
    print(f"| as it runs | {warned[False]} | {len(states[False])} |")
    print(f"| CUDA_LAUNCH_BLOCKING=1 | {warned[True]} | {len(states[True])} |")
    print(
        f"weights equal: {not differing} ({len(differing)} tensor(s) differ{': ' + differing[0] if differing else ''})"
    )
    return 1 if differing or any(warned.values()) else 0


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    fast = sub.add_parser("speed", help="side stream against current stream, plain torch DDP")
    fast.add_argument("--repeats", type=int, default=2)
    fast.add_argument("--steps", type=int, default=40)
    fast.add_argument("--warmup", type=int, default=10)
    fast.add_argument("--batch", type=int, default=256)
    same = sub.add_parser("weights", help="hydrali's DDP weights against a run with every launch synchronous")
    same.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args(argv)
    if args.what == "speed":
        return speed(args.repeats, args.steps, args.warmup, args.batch)
    return weights(args.epochs)


if __name__ == "__main__":
    sys.exit(main())
