"""What a torch profiler trace (Chrome JSON, e.g. from torch_ddp_bound.py --trace) shows of a GPU's time: per CUDA
stream its kernels' busy time and top kernels, the NCCL kernels' time, how much of it other streams' kernels ran
beside, the GPU's idle time (no kernel on any stream) within the traced span, how far the host ran ahead of the
GPU (a kernel's start after its launch: near 0, the GPU waited for the host), and per thread the calls that block it
until the GPU is done (device, stream and event synchronizations) or may (allocating or freeing device or pinned
memory), with the thread's name where the trace has it (Python's threads; CUDA's calls from other threads carry an
opaque id: cuda_backtraces.py names those by their native stacks).

    python3 -m hydrali.bench.gpu.trace_summary TRACE.json [TRACE.json ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict

TOP_KERNELS = 4  # streams listed, kernels listed per stream
TOP_CALLS = 8  # blocking calls listed (per thread and name)
# CUDA calls that wait for the GPU: explicit synchronizations, and allocations and frees (cudaFree and cudaFreeHost
# synchronize the device; a pool that grows calls them)
BLOCKING = ("Synchronize", "Free", "Malloc", "HostAlloc", "HostRegister", "MemCreate", "MemMap", "MemUnmap")
HOST_BOUND_US = 50  # a kernel starting this soon after its launch call waited for the host


def _load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _covered(intervals: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Time of `intervals` (merged) that `cover` (merged) also spans, in the trace's unit."""
    total, j = 0.0, 0
    for start, end in intervals:
        while j < len(cover) and cover[j][1] <= start:
            j += 1
        k = j
        while k < len(cover) and cover[k][0] < end:
            total += min(end, cover[k][1]) - max(start, cover[k][0])
            k += 1
    return total


def summarize(path: str) -> str:
    """A few lines on the GPU time of one trace: per stream, NCCL's share and overlap, idle time (milliseconds)."""
    events = _load(path)
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    if not kernels:
        return f"{path}: no kernels (a CPU-only trace?)"
    by_stream: dict[int, list[dict]] = defaultdict(list)
    for kernel in kernels:
        by_stream[kernel["args"].get("stream", -1)].append(kernel)
    span_start = min(k["ts"] for k in kernels)
    span = max(k["ts"] + k["dur"] for k in kernels) - span_start
    busy = _union([(k["ts"], k["ts"] + k["dur"]) for k in kernels])
    idle = span - sum(b - a for a, b in busy)
    lines = [f"{path}: {span / 1e3:.1f} ms of kernels' span, GPU idle {idle / 1e3:.1f} ms"]
    nccl = _union([(k["ts"], k["ts"] + k["dur"]) for k in kernels if "nccl" in k["name"].lower()])
    for stream, items in sorted(by_stream.items(), key=lambda kv: -sum(k["dur"] for k in kv[1]))[:TOP_KERNELS]:
        times: dict[str, float] = defaultdict(float)
        for k in items:
            times[k["name"][:60]] += k["dur"]
        top = ", ".join(f"{name} {t / 1e3:.1f}" for name, t in sorted(times.items(), key=lambda x: -x[1])[:TOP_KERNELS])
        lines.append(f"  stream {stream}: {len(items)} kernels, {sum(times.values()) / 1e3:.1f} ms: {top}")
    if nccl:
        others = _union([(k["ts"], k["ts"] + k["dur"]) for k in kernels if "nccl" not in k["name"].lower()])
        nccl_ms = sum(b - a for a, b in nccl) / 1e3
        beside = _covered(nccl, others) / 1e3
        lines.append(f"  NCCL kernels {nccl_ms:.1f} ms, of which other kernels ran beside {beside:.1f} ms")
    lines += _host_lines(events, kernels, _thread_names(events))
    return "\n".join(lines)


def _thread_names(events: list[dict]) -> dict[int, str]:
    """{thread id: name} of the trace's thread_name metadata."""
    return {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}


def _host_lines(events: list[dict], kernels: list[dict], names: dict[int, str]) -> list[str]:
    """The host's lead over the GPU (kernel start minus its launch call's start) and the blocking calls per thread."""
    launches = {
        e["args"].get("correlation"): e for e in events if e.get("cat") == "cuda_runtime" and e.get("ph") == "X"
    }
    leads = sorted(
        k["ts"] - launches[k["args"]["correlation"]]["ts"] for k in kernels if k["args"].get("correlation") in launches
    )
    lines = []
    if leads:
        near = sum(1 for lead in leads if lead < HOST_BOUND_US) / len(leads)
        lines.append(
            f"  host ahead of the GPU: median {leads[len(leads) // 2] / 1e3:.1f} ms, 10th percentile "
            f"{leads[len(leads) // 10] / 1e3:.1f} ms; {near:.1%} of kernels started within {HOST_BOUND_US} us of launch"
        )
    blocking: dict[tuple[int, str], list[float]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and _blocks(e["name"]):
            blocking[(e["tid"], e["name"])].append(e["dur"])
    for (tid, name), durations in sorted(blocking.items(), key=lambda kv: -sum(kv[1]))[:TOP_CALLS]:
        total, longest = sum(durations) / 1e3, max(durations) / 1e3
        thread = f"{tid} ({names[tid]})" if tid in names else str(tid)
        lines.append(f"  thread {thread}: {len(durations)} x {name}, {total:.1f} ms, longest {longest:.1f} ms")
    return lines


def _blocks(call: str) -> bool:
    """Whether a CUDA call of this name waits, or may wait, for the GPU (BLOCKING); asynchronous ones do not."""
    return any(word in call for word in BLOCKING) and "Async" not in call


def main() -> None:
    """Print the summary of each trace named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+")
    for path in parser.parse_args().traces:
        print(summarize(path))


if __name__ == "__main__":
    main()
