"""Data at scale: `hydrali convert` writes WebDataset tar shards that DALI reads back (what it read, observed), and
`data=webdataset` trains from them, from a folder or from a local S3-compatible server (moto's), on both backends."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from nvidia.dali import pipeline_def

from hydrali.core.data.webdataset import ShardSource, read_manifest, split_shards
from hydrali.core.run.runner import run
from hydrali.tasks.classification.datasets import image_files, scan_image_folder, write_digits
from hydrali.tasks.classification.recipes import read_files
from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY, compose_config, with_plugin_callback
from tests.support.datasets import write_one_image_per_class
from tests.support.object_store import S3Server

# 12 epochs of the tiny network: converged (val/acc about 0.98), so that only chance separates two orders of the samples
CONVERGED = ["epochs=12", *TINY]
SAME_ACCURACY = 0.03  # best val/acc of a run from shards and of one from the folder: equal within chance (below)


def convert(tmp_path: Path, data_dir: Path, out: Path | str, *args: str):
    """`hydrali convert` of the session's digits (or what `args` name) into `out`."""
    return run_cli("convert", f"paths.data_dir={data_dir}", f"out={out}", *args, cwd=tmp_path)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, data_dir) -> Path:
    """The bundled digits converted once for the module."""
    root = tmp_path_factory.mktemp("wds")
    out = convert(root, data_dir, root / "shards", "shard_size=100")  # shuffled with the default seed, as training
    assert out.returncode == 0, out.stderr[-3000:]
    assert "train: 1437 samples in 15 shards" in out.stdout, out.stdout  # shard_size decides: 15 tars of <= 100
    assert "val  : 360 samples in 8 shards" in out.stdout, out.stdout  # min_shards decides: 8 tars of 45
    return root / "shards"


def what_dali_reads(source: ShardSource) -> list[tuple[str, int]]:
    """(sha1 of the encoded image, label) of every sample DALI's reader gives `source` in one pass."""

    @pipeline_def(batch_size=64, num_threads=1, device_id=None, seed=3)
    def encoded():
        images, labels = read_files(source, initial_fill=1)
        return images, labels

    pipe = encoded()
    pipe.build()
    size = pipe.epoch_size("Reader")
    read = []
    while len(read) < size:
        images, labels = pipe.run()
        read += [(hashlib.sha1(images.at(i).tobytes()).hexdigest(), int(labels.at(i)[0])) for i in range(len(images))]
    return read[:size]


def test_dali_reads_back_every_image_of_both_splits_with_its_label_from_the_converted_shards(shards, data_dir):
    folder = scan_image_folder(write_digits(data_dir / "digits", size=32, val_fraction=0.2))
    manifest = read_manifest(str(shards))
    assert manifest.facts["classes"] == list(folder.classes)
    assert (manifest.splits["train"].samples, manifest.splits["val"].samples) == (1437, 360)
    for split, split_dir in (("train", folder.train_dir), ("val", folder.val_dir)):
        located = split_shards(str(shards), manifest, split)
        assert len(located.paths) == (15 if split == "train" else 8)
        assert all(Path(p).with_suffix(".idx").is_file() for p in located.paths)
        read = what_dali_reads(
            ShardSource(str(shards), 0, 1, False, paths=located.paths, index_paths=located.index_paths)
        )
        expected = sorted(
            (hashlib.sha1(path.read_bytes()).hexdigest(), folder.classes.index(path.parent.name))
            for path in image_files([split_dir])
        )
        assert sorted(read) == expected, f"{split}: every file once, with its folder's label"
        labels_in_order = [label for _, label in read[:50]]
        assert len(set(labels_in_order)) >= 8, "written shuffled: the first samples mix the classes"


def _use(command: str, *args: str) -> None:
    """`hydrali <command> <args>` in this process, to its end (exit code 0): what a command does with a run trained on
    shards is what is checked here, not the command line, whose own tests are test_after_training's."""
    from hydrali.core.cli.use import run_command

    with pytest.raises(SystemExit) as ended:
        run_command(command, list(args))
    assert ended.value.code == 0, f"hydrali {command} exited {ended.value.code}"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])  # keras: trained,
# scored and labelled in this process
def test_training_from_shards_reaches_the_folders_val_acc(tmp_path, data_dir, shards, backend, monkeypatch):
    quiet = LIGHTNING_QUIET if backend == "lightning" else KERAS_QUIET
    best = {}
    for name, data in (("folder", []), ("shards", ["data=webdataset", f"data.root={shards}", "data.image_size=16"])):
        # in this process: what is checked is what a run reads from shards, not the command line
        run(
            compose_config(
                [f"backend={backend}", "tracking=none", *CONVERGED, *quiet, *data], tmp_path, data_dir, tmp_path / name
            )
        )
        summary = read_summary(tmp_path / name)
        assert summary["train_images"] == 12 * (1437 // 64) * 64 and summary["val_images"] == 360
        best[name] = summary["best"]["val/acc"]
    assert best["folder"] > 0.9
    # the two runs see the images in other orders: their accuracies on 360 photos near 0.98 differ by chance with a
    # standard deviation of about 0.01 (sqrt(2 x 0.98 x 0.02 / 360)); measured 0.992 and 0.978 on Keras with
    # TensorFlow's oneDNN kernels (2026-11-27), so the bound is 3 of those
    assert best["shards"] == pytest.approx(best["folder"], abs=SAME_ACCURACY)
    # the run trained on shards, used as any run: eval scores its val split as training did; predict labels the
    # same images given as files, as often rightly as eval says
    trained = tmp_path / "shards"
    monkeypatch.chdir(tmp_path)  # where a user would run them
    _use("eval", str(trained))
    acc = json.loads((trained / "eval/val/metrics.json").read_text())["metrics"]["val/acc"]
    assert acc == pytest.approx(best["shards"], abs=1e-4)
    _use("predict", str(trained), f"source={data_dir / 'digits' / 'val'}", "out=pred")
    with (trained / "pred" / "predictions.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 360
    assert sum(Path(r["file"]).parts[0] == r["class_1"] for r in rows) / len(rows) == pytest.approx(acc, abs=1e-9)


@pytest.mark.slow
def test_two_ddp_processes_read_disjoint_shards_that_cover_the_training_set(tmp_path):
    # every image its own class: the labels each process trained on name the samples DALI read for it
    classes, batch = 36, 9  # 18 samples a process: 2 whole batches, its whole range
    write_one_image_per_class(tmp_path / "ds", classes)
    shards = tmp_path / "shards"
    out = run_cli(
        "convert", "data=imagefolder", f"data.root={tmp_path / 'ds'}", f"out={shards}", "seed=null", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    record = tmp_path / "record"
    res = run_cli(
        "data=webdataset",
        f"data.root={tmp_path / 'shards'}",
        "data.image_size=24",
        f"data.batch_size={batch}",
        "backend.accelerator=cpu",
        "backend.devices=2",
        "backend.strategy=ddp",
        "epochs=1",
        "tracking=none",
        *TINY,
        *LIGHTNING_QUIET,
        "pipeline.options.initial_fill=1",
        with_plugin_callback("labels", "RecordTrainingLabels", folder=str(record)),
        f"hydra.run.dir={tmp_path / 'ddp'}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    read = [[int(x) for x in (record / f"labels_rank{r}.txt").read_text().split()] for r in (0, 1)]
    assert len(read[0]) == len(set(read[0])) == 18 and len(read[1]) == len(set(read[1])) == 18
    assert set(read[0]).isdisjoint(read[1]), "the two processes read disjoint ranges of the shards"
    assert set(read[0]) | set(read[1]) == set(range(classes)), "together they read the whole training set"
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["facts"]["classes"][:2] == ["c000", "c001"]
    assert isinstance(manifest["made_by"]["seed"], int), "seed=null: the shuffle's drawn seed is recorded"


@pytest.mark.slow
def test_training_from_an_s3_bucket_equals_training_from_the_same_shards_on_disk(tmp_path, data_dir, shards):
    args = [f"paths.data_dir={data_dir}", "tracking=none", "data=webdataset", "data.image_size=16", "epochs=2"]
    args += [*TINY, *LIGHTNING_QUIET]
    with S3Server() as s3:
        s3.upload(shards, "datasets", "digits")
        remote = run_cli(
            *args, "data.root=s3://datasets/digits", f"hydra.run.dir={tmp_path / 's3'}", cwd=tmp_path, env=s3.env
        )
        assert remote.returncode == 0, remote.stderr[-3000:]
        missing_bucket = run_cli(*args, "data.root=s3://nobucket/digits", cwd=tmp_path, env=s3.env)
        missing_prefix = run_cli(*args, "data.root=s3://datasets/other", cwd=tmp_path, env=s3.env)
        no_credentials = run_cli(
            *args, "data.root=s3://datasets/digits", cwd=tmp_path, env={**s3.env, **s3.without_credentials}
        )
    local = run_cli(*args, f"data.root={shards}", f"hydra.run.dir={tmp_path / 'local'}", cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    from_s3, from_disk = read_summary(tmp_path / "s3"), read_summary(tmp_path / "local")
    assert [h["train/loss"] for h in from_s3["history"]] == [h["train/loss"] for h in from_disk["history"]]
    assert from_s3["best"] == from_disk["best"]
    fails_with(missing_bucket, "s3://nobucket/digits/manifest.json", "bucket nobucket does not exist")
    fails_with(missing_prefix, "s3://datasets/other/manifest.json", "no such object")
    fails_with(no_credentials, "no credentials", "AWS_ACCESS_KEY_ID")


@pytest.mark.slow
def test_shards_train_at_the_image_size_their_data_was_converted_at_unless_told(tmp_path, shards):
    """The digits are 32 px photos (conf/data/digits.yaml): converted, their shards say so, and data=webdataset
    trains them at 32 px without data.image_size (before: data=webdataset's 224 px, 25 s an epoch instead of 4 s)."""
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["made_by"]["image_size"] == 32
    run = tmp_path / "run"
    args = ["data=webdataset", f"data.root={shards}", "epochs=1", "pipeline=light", "model.widths=[8,16,32]"]
    out = run_cli(*args, *LIGHTNING_QUIET, "tracking=none", f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "data.image_size=32: the size the shards' data was converted at" in out.stdout + out.stderr
    recorded = json.loads((run / "run.json").read_text())["config"]
    assert recorded["data"]["image_size"] == 32, "the run dir records the number, as eval and export read it"
    # a manifest written before hydrali recorded the size: one line naming the setting
    old = tmp_path / "old-shards"
    shutil.copytree(shards, old)
    del manifest["made_by"]["image_size"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    fails_with(run_cli("data=webdataset", f"data.root={old}", cwd=tmp_path), "pass data.image_size")


def test_bad_conversions_and_shards_are_one_line_and_write_nothing(tmp_path, data_dir, shards):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    fails_with(convert(tmp_path, data_dir, used), f"out={used} already holds files")
    assert sorted(p.name for p in used.iterdir()) == ["keep.txt"]
    fails_with(run_cli("convert", f"paths.data_dir={data_dir}", cwd=tmp_path), "needs out=")
    fails_with(convert(tmp_path, data_dir, "s3://bucket/digits"), "convert writes a local folder")
    fails_with(convert(tmp_path, data_dir, tmp_path / "x", "shard_size=0"), "shard_size=0")
    fails_with(convert(tmp_path, data_dir, tmp_path / "x", "data=webdataset", f"data.root={shards}"), "already sharded")
    fails_with(
        convert(
            tmp_path, data_dir, tmp_path / "x", "task=detection", "data=webdataset_detection", f"data.root={shards}"
        ),
        "already sharded",
    )
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.tmp-*"))
    fails_with(
        run_cli("data=webdataset", f"data.root={tmp_path}", f"paths.data_dir={data_dir}", cwd=tmp_path),
        f"data.root={tmp_path} holds no manifest.json",
    )
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)
    (broken / "train" / "shard-000003.idx").unlink()
    fails_with(
        run_cli("data=webdataset", f"data.root={broken}", f"paths.data_dir={data_dir}", cwd=tmp_path),
        "shard-000003.idx is missing",
    )
    fails_with(
        run_cli("task=detection", "data=webdataset", f"data.root={shards}", cwd=tmp_path),
        "data=webdataset is a dataset of task=classification, not of task=detection",
        "choose a data= of task=detection: coco | digits_detection | webdataset_detection",
    )
    fails_with(
        run_cli("task=detection", "data=webdataset_detection", f"data.root={shards}", cwd=tmp_path),
        f"data.root={shards} holds classification shards: train them with task=classification data=webdataset",
    )


def test_convert_into_the_dataset_it_reads_or_around_it_is_one_line_and_writes_nothing(tmp_path, digits_copy):
    before = sorted(tmp_path.rglob("*"))
    source = digits_copy.resolve()
    inside = digits_copy / "train" / "shards"
    fails_with(
        run_cli("convert", "data=imagefolder", f"data.root={digits_copy}", f"out={inside}", cwd=tmp_path),
        f"out={inside} is inside data.root={source}: the shards would be written into the dataset",
    )
    fails_with(
        run_cli("convert", "data=imagefolder", f"data.root={digits_copy}", f"out={tmp_path}", cwd=tmp_path),
        f"data.root={source} is inside out={tmp_path}",
    )
    assert sorted(tmp_path.rglob("*")) == before


def test_convert_help_names_its_keys_and_hydrali_help_names_convert(tmp_path):
    shown = run_cli("convert", "--help", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: hydrali convert key=value ...")
    for key in ("out:", "format: webdataset", "shard_size:", "min_shards:", "shuffle:"):
        assert key in shown.stdout
    assert "hydrali convert data=imagefolder" in run_cli("--help", cwd=tmp_path).stdout
