"""hydrali-bench's section 7 (small: 32 x 32 photos, experiment=cifar10, from the files and decoded once) on a machine
without a GPU: what can be checked there. Its rows need a GPU: here the section is one "skipped: needs a GPU" row;
its config keys are checked at composition; the configs it would train are experiment=cifar10's, not the bench's
ImageNet-like defaults; its synthetic folder holds 32 x 32 quality-75 JPEG files that DALI decodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose

from hydrali.bench.synthetic import write_small_synthetic
from hydrali.core.errors import HydraliError


def bench_cli(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    """`hydrali-bench <overrides>` run from `cwd`."""
    return subprocess.run(
        [sys.executable, "-m", "hydrali.bench.cli", *overrides],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("bench.small.stepz=3", "bench.small.stepz"),  # not a key of the section
        ("bench.small.steps=many", "bench.small.steps"),  # not an int
    ],
)
def test_a_wrong_small_setting_is_one_error_naming_it(override, named, tmp_path):
    done = bench_cli(f"hydra.run.dir={tmp_path}/run", "bench.sections=[small]", override, cwd=tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("hydrali-bench: error: ") and named in line


def test_without_a_gpu_the_section_is_one_skipped_row_with_its_reason_and_writes_nothing(bench_with, tmp_path):
    bench = bench_with("bench.sections=[small]")
    if bench.machine.gpus:
        pytest.skip("this machine has a GPU")

    report = bench.run()

    [row] = report.rows.values()
    assert row.section == "small" and row.skipped.startswith("needs a GPU (") and row.repeats == []
    [line] = report.table(["small"]).splitlines()[2:]
    assert line.startswith("| 7 small images | ") and "| skipped: needs a GPU (" in line
    assert not (tmp_path / "data").exists()  # skipped before its synthetic photos are written


def test_a_window_without_a_warm_up_step_is_an_error_naming_the_setting(bench_with):
    bench = bench_with("bench.sections=[small]", "bench.small.warmup=0")
    with pytest.raises(HydraliError, match=r"^bench\.small\.warmup=0: .* at least 1"):
        bench.run()


def test_the_section_trains_experiment_cifar10_from_the_files_and_decoded_once(bench_with, tmp_path):
    bench = bench_with(
        "data.batch_size=4",  # the command line's classification keys are the other sections'
        "data.image_size=64",
        "pipeline.num_threads=3",  # its pipeline keys reach this section too
        "bench.small.synthetic.classes=2",
        "bench.small.synthetic.train_per_class=3",
        "bench.small.synthetic.val_per_class=1",
    )
    experiment = compose("config", overrides=["experiment=cifar10"])

    configs = bench.small_configs()

    assert "small" in [str(s) for s in bench.bench.sections]  # in a plain `hydrali-bench` run's sections
    assert list(configs) == ["false", "true"]
    for once, cfg in configs.items():
        assert cfg.pipeline.options.decode_once is (once == "true")
        assert cfg.pipeline.name == "small_images" and cfg.pipeline.num_threads == 3
        assert cfg.model == experiment.model and cfg.optim.lr == experiment.optim.lr  # the experiment's network
        # the experiment's batch and 32 px, neither conf/bench.yaml's ImageNet-like data.* nor the command line's
        assert (cfg.data.batch_size, cfg.data.image_size) == (experiment.data.global_batch, 32) == (512, 32)
        assert cfg.data.global_batch is None
        assert cfg.backend.name == "lightning" and cfg.backend.devices == 1
        assert Path(cfg.data.root) == tmp_path / "data" / "synthetic-small-2x3x1"
    assert sorted(p.name for p in (tmp_path / "data" / "synthetic-small-2x3x1" / "train").iterdir()) == [
        "class0",
        "class1",
    ]


def test_a_real_set_of_small_photos_is_read_from_bench_small_root(bench_with, tmp_path):
    root = write_small_synthetic(tmp_path / "cifar", classes=2, train_per_class=1, val_per_class=1)
    configs = bench_with(f"bench.small.root={root}").small_configs()
    assert {cfg.data.root for cfg in configs.values()} == {str(root)}
    assert not (tmp_path / "data").exists()  # no synthetic folder written


def test_the_synthetic_small_folder_holds_32px_quality_75_jpegs_that_dali_decodes(tmp_path):
    from nvidia.dali import fn, pipeline_def
    from PIL import Image

    from hydrali.tasks.classification.datasets import scan_image_folder

    root = write_small_synthetic(tmp_path / "small", classes=3, train_per_class=4, val_per_class=2)
    written = {p: p.stat().st_mtime_ns for p in root.rglob("*.jpg")}

    info = scan_image_folder(str(root))  # what hydrali reads: class folders of train/ and val/
    assert (info.num_classes, info.num_train, info.num_val) == (3, 12, 6)
    reference = Image.new("RGB", (32, 32))
    reference_file = tmp_path / "q75.jpg"
    reference.save(reference_file, quality=75)
    with Image.open(reference_file) as ref:
        q75 = ref.quantization
    for path in written:
        with Image.open(path) as img:
            assert (img.format, img.size, img.mode) == ("JPEG", (32, 32), "RGB")
            assert img.quantization == q75  # encoded at quality 75
            assert np.asarray(img).std() > 10  # a picture, not a flat colour
    sizes = [path.stat().st_size for path in written]
    assert 400 < np.mean(sizes) < 2000  # about CIFAR-10's photos at quality 75 (0.9 KB)

    @pipeline_def(batch_size=12, num_threads=1, device_id=None)
    def decode():
        jpegs, labels = fn.readers.file(file_root=str(root / "train"))
        return fn.decoders.image(jpegs, device="cpu"), labels

    pipe = decode()
    pipe.build()
    images, labels = pipe.run()
    assert [images.at(i).shape for i in range(12)] == [(32, 32, 3)] * 12
    assert sorted(int(labels.at(i)[0]) for i in range(12)) == [0] * 4 + [1] * 4 + [2] * 4

    write_small_synthetic(root, classes=3, train_per_class=4, val_per_class=2)  # written once: not again
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.jpg")} == written
