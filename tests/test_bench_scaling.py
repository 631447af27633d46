"""hydrali-bench's scaling section (6): whole hydrali runs on 1 device and on several, interleaved, each N-device
row against its 1-device row. On this machine without a GPU: Keras on 1 and 2 logical CPU replicas."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hydrali.bench.scaling import device_counts

pytestmark = [pytest.mark.slow, pytest.mark.keras]


def test_device_counts_are_one_and_the_requested_or_every_visible_gpu():
    assert device_counts([], 4) == [1, 4] and device_counts([], 1) == [1] and device_counts([], 0) == [1]
    assert device_counts([2, 4, 8], 8) == [1, 2, 4, 8] and device_counts([4, 2, 1], 0) == [1, 2, 4]


def test_the_scaling_section_trains_on_one_and_two_replicas_and_prints_the_ratio(tmp_path):
    command = [
        sys.executable,
        "-m",
        "hydrali.bench.cli",
        f"hydra.run.dir={tmp_path}/run",
        f"paths.data_dir={tmp_path}/data",
        "bench.sections=[scaling]",
        "bench.repeats=1",
        "bench.scaling.devices=[2]",
        "bench.scaling.runs=['backend=keras']",
        "bench.scaling.overrides=['epochs=2','data.verify=off','tracking=none','data.image_size=32',"
        "'data.batch_size=8','throughput_warmup_steps=1']",
        "bench.scaling.synthetic.classes=2",
        "bench.scaling.synthetic.train_per_class=48",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| 6 scaling")]
    assert len(table) == 2 and "(baseline)" in table[0] and "x 1 CPU replica |" in table[1], done.stdout[-2000:]
    rows = {row["key"]: row for row in json.loads((tmp_path / "run" / "bench.json").read_text())["rows"]}
    one, two = rows["scaling/0/1"], rows["scaling/0/2"]
    assert two["baselines"] == ["scaling/0/1"] and two["ratios"]["1 CPU replica"] == pytest.approx(
        two["images_per_s"] / one["images_per_s"]
    )
    for devices, row in ((1, one), (2, two)):  # each figure is its run's own steady state, on as many replicas
        summary = json.loads((tmp_path / "run" / "scaling" / f"0-{devices}" / "r1" / "summary.json").read_text())
        assert summary["world_size"] == devices and summary["global_batch"] == 8 * devices
        assert row["repeats"] == [pytest.approx(summary["steady_images_per_second"])]
