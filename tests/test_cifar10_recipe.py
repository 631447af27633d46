"""experiment=cifar10 on the CPU, on both backends: the recipe as shipped (ResNet-9, the small-image DALI recipe,
one-cycle SGD, label smoothing, the weight average, flip averaging) trains on real photos, a fixed 2,000-image subset
of CIFAR-10 (tests/data/cifar10-subset.tgz: 200 training and 100 validation images per class, written by
bench/cifar10.py from ../shared/data/cifar10.tgz), narrowed for 2 cores: 16-128 channels, batch 64, 4 epochs, 1 of
warm-up.

The narrowing keeps the recipe's weight average at its span in epochs: optim.ema_decay=0.99 averages about the last
100 steps, one epoch of 50,000 photos at 512 on the GPU; at 31 steps an epoch here it averaged the first three epochs'
weights into the validated network, which scored near chance until the last epoch and left a best value that moved
with each CPU's round-off (Keras 0.161-0.261 over seeds 42, 1, 2 and the three kernel paths below, 2026-11-28).
optim.ema_decay=0.97 averages about the last epoch here, as 0.99 does on the GPU.

Measured on a 2-core Intel Xeon with AVX-512 and AMX (2026-11-28), best val/acc over seeds 42, 1, 2: Keras 0.420,
0.409, 0.436 with oneDNN as hydrali sets it, 0.427, 0.428, 0.438 with ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN's AVX2 kernels,
as on an AVX2 CPU), 0.433, 0.420, 0.448 with TF_ENABLE_ONEDNN_OPTS=0 (TensorFlow's own kernels); Lightning 0.440,
0.436, 0.463, and 0.443, 0.448, 0.460 with ONEDNN_MAX_CPU_ISA=AVX2 (torch's oneDNN too). Chance is 0.10, and a guess's
accuracy on these 1,000 validation photos spreads by 0.01; the full recipe on the GPU: BENCHMARKS.md. THRESHOLD is
0.1 below the lowest of the fifteen (2.5 times their whole spread of 0.054). The runs also show that the recipe read
the photos decoded once (pipeline.options.decode_once): one line per split saying so.

What this CPU check catches, and what it cannot: a recipe that stops learning the photos (a collapse to chance, or a
regression of some 15 points), on either backend. It cannot catch a 5-point regression within CI's time: one run of a
backend takes about a minute on 2 cores, and one run's best val/acc already moves by 0.04-0.05 over seeds and kernel
paths (Keras 0.409-0.448, Lightning 0.436-0.463 above), as much as the regression; telling the two apart needs the
mean of at least three seeds per backend, minutes more of CI. The recipe's accuracy is guarded by the GPU acceptance
check (hydrali.bench.gpu.acceptance, bench/gpu/acceptance.py: experiment=cifar10 on the full data set, 0.915-0.920
best val/acc on one GPU, BENCHMARKS.md).

The same runs check cpu_threads=auto from outside: the framework's own report of its compute threads during training
is this machine's cores less the run's one DALI worker (at least 1), with no thread variable set by the caller; and on
Keras, with no TF_ENABLE_ONEDNN_OPTS set by the caller, that TensorFlow runs its oneDNN CPU kernels (which it leaves
off on CPUs without AVX-512 VNNI, BF16 or AMX, as this AMD EPYC: 5x slower steps without them)."""

from __future__ import annotations

import json
import os

import pytest

from hydrali.bench.cifar10 import unpack
from hydrali.core.data.affinity import THREAD_VARIABLES
from tests.support.cli import REPO, run_cli
from tests.support.configs import with_plugin_callback

THRESHOLD = 0.30  # best val/acc both backends reach on every kernel path measured (see above); chance is 0.1: a
#   collapse, not a 5-point regression (the GPU acceptance check's)
NARROW = [
    "epochs=4",
    "optim.warmup_epochs=1",
    "model.widths=[16,32,64,128]",
    "data.global_batch=64",
    "optim.ema_decay=0.97",  # the weight average over about the last epoch, as the recipe's 0.99 on the GPU
]
DALI_WORKERS = 1


@pytest.fixture(scope="module")
def cifar_subset(tmp_path_factory):
    """The subset's dataset root (train/ and val/ class folders)."""
    return unpack(REPO / "tests" / "data" / "cifar10-subset.tgz", tmp_path_factory.mktemp("cifar10"))


@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])
def test_experiment_cifar10_learns_the_photos_and_the_framework_gets_the_cores_dali_leaves(
    cifar_subset, tmp_path, backend
):
    threads_file = tmp_path / "threads.json"
    quiet = "progress_bar=false"
    out = run_cli(
        "experiment=cifar10",
        f"backend={backend}",
        f"data.root={cifar_subset}",
        *NARROW,
        quiet,
        f"pipeline.num_threads={DALI_WORKERS}",
        "tracking=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        with_plugin_callback("threads", "RecordComputeThreads", path=str(threads_file), framework=backend),
        cwd=tmp_path,
        timeout=900,
        unset=THREAD_VARIABLES,  # cli_env leaves out the Keras variables too
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the recipe reads the photos decoded once (pipeline.options.decode_once): each split of the subset decoded once
    decoded = [line for line in (out.stdout + out.stderr).splitlines() if "once into memory" in line]
    assert len(decoded) == 2 and "training split's 2000 images" in decoded[0], decoded
    assert "validation split's 1000 images" in decoded[1], decoded
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    print(f"{backend}: best val/acc {summary['best']['val/acc']:.4f}")  # shown by pytest -s
    assert summary["best"]["val/acc"] >= THRESHOLD, summary["history"]
    cores = len(os.sched_getaffinity(0))
    report = json.loads(threads_file.read_text())
    assert report["threads"] == max(1, cores - DALI_WORKERS)
    if backend == "keras":
        assert report["onednn"] is True, report
