"""Mistakes a user can make end non-zero with one clear line naming the fix, and no traceback."""

import pytest

from tests.support.checks import fails_with
from tests.support.cli import REPO, run_cli


def _fails_at_composition_with(out, *needles: str) -> None:
    """`fails_with`, and that line is all the run printed on stderr (Hydra's own several lines folded into it)."""
    fails_with(out, *needles)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_an_unknown_key_names_the_closest(tmp_path):
    _fails_at_composition_with(
        run_cli("optim.lrr=0.1", cwd=tmp_path), "optim.lrr is not a setting of optim: did you mean optim.lr?"
    )


def test_an_option_a_group_does_not_have_lists_the_options(tmp_path):
    _fails_at_composition_with(
        run_cli("pipeline=standrad", cwd=tmp_path),
        "pipeline=standrad is not an option of pipeline: choose one of light, scale_jitter, small_images, ssd, "
        "standard",
    )


def test_a_non_ascii_path_says_to_quote_it(tmp_path):
    _fails_at_composition_with(
        run_cli("data=imagefolder", "data.root=/data/café", cwd=tmp_path), "non-ASCII", "data.root='/data/café'"
    )
    # and quoted as the message says, the path reaches hydrali (which then names the missing folder)
    (tmp_path / "café").mkdir()
    fails_with(
        run_cli("data=imagefolder", f"data.root='{tmp_path / 'café'}'", cwd=tmp_path),
        f"{tmp_path / 'café' / 'train'} is missing",
    )


def test_a_learning_rate_that_is_not_positive_is_one_line(tmp_path):
    fails_with(run_cli("optim.lr=-1", cwd=tmp_path), "optim.lr=-1.0: the learning rate must be above 0")
    assert not any(tmp_path.iterdir())  # no MLflow store, and no outputs/<date>/ left by the run dir Hydra made
    (tmp_path / "outputs").mkdir()  # a folder the user made stays, empty as it was
    fails_with(run_cli("optim.lr=-1", cwd=tmp_path), "optim.lr=-1.0: the learning rate must be above 0")
    assert [p.name for p in tmp_path.iterdir()] == ["outputs"] and not any((tmp_path / "outputs").iterdir())


def test_a_misspelled_key_added_with_plus_is_refused_naming_the_closest(tmp_path):
    fails_with(
        run_cli("+data.bach_size=8", cwd=tmp_path),
        "data.bach_size is not a setting of data: did you mean data.batch_size?",
    )


@pytest.mark.parametrize(
    "uri, needle",
    [
        ("sqlite:////proc/nope/x.db", "cannot create the MLflow store's folder /proc/nope"),
        ("http://127.0.0.1:9/", "cannot reach the MLflow server at tracking.uri=http://127.0.0.1:9/"),
    ],
)
def test_a_tracking_store_that_cannot_be_opened_is_one_line_within_seconds(tmp_path, uri, needle):
    import time

    started = time.monotonic()
    out = run_cli(f"tracking.uri={uri}", cwd=tmp_path)
    fails_with(out, needle, "tracking=none")
    assert time.monotonic() - started < 15


def test_a_run_dir_that_cannot_be_made_names_the_setting(tmp_path):
    fails_with(
        run_cli("hydra.run.dir=/proc/forbidden", cwd=tmp_path),
        "cannot create the run dir /proc/forbidden (No such file or directory): pass a writable hydra.run.dir",
    )


def test_a_wrong_value_type_names_the_key_and_the_type(tmp_path):
    _fails_at_composition_with(run_cli("data.batch_size=large", cwd=tmp_path), "data.batch_size", "Integer")


def test_a_value_outside_its_choices_lists_them(tmp_path):
    _fails_at_composition_with(run_cli("pipeline.device=tpu", cwd=tmp_path), "pipeline.device", "auto, cpu, gpu")


def test_a_missing_data_root_says_how_to_set_it(tmp_path):
    fails_with(run_cli("data=imagefolder", cwd=tmp_path), "data.root is required", "data.root=/path")


def test_a_data_root_that_does_not_exist_is_named(tmp_path):
    fails_with(
        run_cli("data=imagefolder", f"data.root={tmp_path / 'nowhere'}", cwd=tmp_path),
        f"data.root={tmp_path / 'nowhere'} does not exist",
    )


def test_a_dataset_folder_with_no_images_is_named(tmp_path):
    for split in ("train", "val"):
        (tmp_path / "ds" / split / "cat").mkdir(parents=True)
        (tmp_path / "ds" / split / "cat" / "notes.txt").write_text("not an image")
    fails_with(
        run_cli("data=imagefolder", f"data.root={tmp_path / 'ds'}", cwd=tmp_path),
        f"{tmp_path / 'ds' / 'train'} holds no images",
    )


def test_a_pipeline_that_does_not_fit_the_task_names_the_choices(tmp_path):
    # a user's own recipe config, written for another task, found through hydra.searchpath
    (tmp_path / "myconf" / "pipeline").mkdir(parents=True)
    standard = (REPO / "conf" / "pipeline" / "standard.yaml").read_text()
    (tmp_path / "myconf" / "pipeline" / "ssd.yaml").write_text(
        standard.replace("name: standard", "name: ssd").replace("task: classification", "task: detection")
    )
    out = run_cli(f"hydra.searchpath=[file://{tmp_path / 'myconf'}]", "pipeline=ssd", cwd=tmp_path)
    fails_with(out, "pipeline=ssd is a detection recipe", "task=classification", "light, small_images, standard")


def test_a_corrupt_jpeg_is_named_before_training(tmp_path, digits_copy):
    victim = sorted((digits_copy / "train" / "3").glob("*.jpg"))[5]
    victim.write_bytes(b"\xff\xd8\xff\xe0" + b"not really a jpeg" * 20)
    out = run_cli(
        "data=imagefolder",
        f"data.root={digits_copy}",
        "data.image_size=32",
        "epochs=1",
        "tracking=none",
        "progress_bar=false",
        cwd=tmp_path,
    )
    fails_with(out, f"cannot decode {victim}", "Remove or replace the file")
    assert not list(tmp_path.glob("outputs/*/*/checkpoints")), "it stops before any training"


@pytest.mark.slow  # the run trains its first epoch before it reaches the file
def test_a_truncated_jpeg_found_after_training_started_is_named_by_the_decoder_path(tmp_path, digits_copy):
    # data.verify=off: the file reaches DALI, and the decode error is traced back to the file.
    # A JPEG cut short keeps its start, so DALI fails cleanly on it (a garbage one can crash DALI 2.4).
    victim = sorted((digits_copy / "val" / "7").glob("*.jpg"))[2]
    victim.write_bytes(victim.read_bytes()[:200])
    out = run_cli(
        "data=imagefolder",
        f"data.root={digits_copy}",
        "data.image_size=32",
        "data.verify=off",
        "epochs=1",
        "tracking=none",
        "progress_bar=false",
        cwd=tmp_path,
    )
    fails_with(out, "cannot decode", str(victim))


@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_zero_devices_is_refused_on_both_backends(tmp_path, backend):
    fails_with(
        run_cli(f"backend={backend}", "backend.devices=0", cwd=tmp_path), "backend.devices=0", "number of devices"
    )


def test_lightnings_own_gradient_accumulation_names_the_key_every_backend_takes(tmp_path):
    out = run_cli("backend.trainer.accumulate_grad_batches=4", cwd=tmp_path)
    fails_with(out, "backend.trainer.accumulate_grad_batches", "it is now optim.accumulate_grad_batches")
    out = run_cli("+backend.trainer.accumulate_grad_batches=4", cwd=tmp_path)  # added to Trainer's options
    fails_with(out, "backend.trainer.accumulate_grad_batches=4", "pass optim.accumulate_grad_batches=4 instead")
    assert not any(tmp_path.iterdir())


def test_more_accumulated_batches_than_an_epoch_has_is_refused_by_the_plan(tmp_path, data_dir):
    out = run_cli(
        "data.batch_size=400",
        "optim.accumulate_grad_batches=4",
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
    )
    fails_with(out, "optim.accumulate_grad_batches=4 is more than the 3 batch(es) of 400 images", "at most 3")


def test_the_old_keras_replicas_key_names_its_successor(tmp_path):
    fails_with(run_cli("backend=keras", "backend.replicas=2", cwd=tmp_path), "backend.replicas", "backend.devices")


@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_a_batch_larger_than_a_shard_is_refused_on_both_backends(tmp_path, data_dir, backend):
    out = run_cli(f"backend={backend}", "data.batch_size=4000", f"paths.data_dir={data_dir}", cwd=tmp_path)
    fails_with(out, "data.batch_size=4000 is larger than a shard", "1437 images", "lower data.batch_size")


def test_dali_on_the_gpu_without_one_names_the_cause(tmp_path, data_dir):
    out = run_cli("pipeline.device=gpu", f"paths.data_dir={data_dir}", cwd=tmp_path)
    fails_with(out, "pipeline.device=gpu but DALI", "use pipeline.device=cpu")


def test_a_recipe_option_the_recipe_does_not_declare_is_named(tmp_path):
    fails_with(
        run_cli("pipeline=light", "+pipeline.options.random_area=[0.5,1.0]", cwd=tmp_path),
        "pipeline.options.random_area is not an option of recipe light",
        "flip_probability",
    )


def test_a_recipe_option_of_the_wrong_kind_is_one_line(tmp_path, data_dir):
    out = run_cli(
        "pipeline.options.flip_probability=[1,2]", f"paths.data_dir={data_dir}", "tracking=none", cwd=tmp_path
    )
    fails_with(out, "recipe standard cannot be defined with pipeline.options=")


def test_a_keras_checkpoint_of_an_unknown_epoch_is_refused_before_anything_is_tracked(tmp_path):
    import h5py

    odd = tmp_path / "best.weights.h5"
    h5py.File(odd, "w").close()  # a readable HDF5 file, named as no epoch
    fails_with(
        run_cli("backend=keras", f"ckpt_path={odd}", cwd=tmp_path),
        "not a hydrali Keras checkpoint",
        "epoch003.weights.h5",
    )
    assert not (tmp_path / "mlflow.db").exists()


def test_a_checkpoint_of_the_other_backend_is_refused(tmp_path):
    keras_ckpt = tmp_path / "epoch003.weights.h5"
    keras_ckpt.write_bytes(b"\x89HDF\r\n\x1a\n")
    fails_with(
        run_cli(f"ckpt_path={keras_ckpt}", cwd=tmp_path), "checkpoint of backend=keras", "resume it with backend=keras"
    )
    lightning_ckpt = tmp_path / "last.ckpt"
    lightning_ckpt.write_bytes(b"PK")
    fails_with(run_cli("backend=keras", f"ckpt_path={lightning_ckpt}", cwd=tmp_path), "checkpoint of backend=lightning")


def test_a_sweep_over_lightning_spawned_processes_is_refused(tmp_path):
    # strategy=ddp: hydrali starts each job's processes (tests/test_launch.py); ddp_spawn would be Lightning's
    out = run_cli(
        "-m",
        "optim.lr=0.1,0.2",
        "backend.accelerator=cpu",
        "backend.devices=2",
        "backend.strategy=ddp_spawn",
        cwd=tmp_path,
    )
    fails_with(out, "-m with backend=lightning and 2 processes per node", "backend.strategy=ddp or auto", "torchrun")


def test_a_network_layout_neither_framework_builds_is_one_line_before_the_run_dir_exists(tmp_path):
    """model.widths alone on photos (the default network there has 4 stages) is refused by the task's layout check
    before anything is written, on both backends, as is a resnet9 of too few widths."""
    from tests.support.datasets import write_one_image_per_class

    write_one_image_per_class(tmp_path / "photos", 2, size=72)
    photos = ["data=imagefolder", f"data.root={tmp_path / 'photos'}", "data.image_size=72", "data.batch_size=2"]
    for backend in ("lightning", "keras"):
        run_dir = tmp_path / f"run-{backend}"
        out = run_cli(*photos, f"backend={backend}", "model.widths=[8,16,32]", f"hydra.run.dir={run_dir}", cwd=tmp_path)
        fails_with(out, "model.layers (4 stages) and model.widths (3) differ in length")
        assert not run_dir.exists()
    run_dir = tmp_path / "run-resnet9"
    out = run_cli(*photos, "model=resnet9", "model.layers=[1]", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    fails_with(out, "model.widths (4 entries) must have one more than model.layers (1 stages)")
    assert not run_dir.exists() and not (tmp_path / "mlflow.db").exists()
