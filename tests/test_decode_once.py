"""pipeline.options.decode_once (core/data/decoded.py, the small_images recipe), on the CPU through the task's own
pipelines: validation gives exactly the batches the files give, each training pass reads every image of the shard
once in a fresh order, DALI's checkpoint resumes the stream mid-epoch, and what cannot work is refused by name.
Both backends' training runs read through it in tests/test_cifar10_recipe.py (experiment=cifar10 turns it on).

Every image is its own class, so a label names the file it came from whatever the order."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf

from hydrali.core.errors import HydraliError
from tests.support.datasets import write_one_image_per_class

SIDE, IMAGES, BATCH, SHARDS = 32, 7, 3, 2  # shards of 3 and 4 images: validation pads both to 2 batches
PLAIN = ("pipeline.options.pad=0", "pipeline.options.flip_probability=0", "pipeline.options.cutout=0")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-per-class")
    write_one_image_per_class(root, IMAGES, size=SIDE)
    return root


def _task():
    from hydrali.tasks.classification.task import ClassificationTask

    return ClassificationTask(name="classification", monitor="val/acc", mode="max", sides={}, label_smoothing=0.0)


def _pipeline(
    make_cfg,
    root,
    *,
    task=None,
    shard_id=1,
    num_shards=SHARDS,
    is_training=True,
    seed=1,
    overrides=(),
    val_split="val",
    **settings,
):
    """The task's small_images pipeline (built) of shard `shard_id` of `num_shards` of one split (validation reads
    the folder `val_split`)."""
    from hydrali.tasks.classification.datasets import scan_image_folder

    cfg = make_cfg("pipeline=small_images", *overrides)
    pipe = (task or _task()).build_pipeline(
        pipeline=cfg.pipeline,
        data=OmegaConf.create({"image_size": SIDE}),
        model=cfg.model,
        dataset=scan_image_folder(root, val_split=val_split),
        plan=SimpleNamespace(per_replica_batch=BATCH, num_shards=num_shards, device="cpu"),
        shard=SimpleNamespace(shard_id=shard_id, device_id=None, pipeline_seed=seed),
        layout="HWC",
        is_training=is_training,
        **settings,
    )
    pipe.build()
    return pipe


def _batches(pipe, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` batches of (images, labels) as NumPy."""
    out = []
    for _ in range(count):
        images, labels = pipe.run()
        out.append((np.asarray(images.as_array()), np.asarray(labels.as_array()).reshape(-1)))
    return out


@pytest.mark.parametrize("shard_id", [0, 1])
def test_validation_from_memory_gives_the_files_batches_padding_included(make_cfg, folder, shard_id):
    passes = 2 * 2  # two validations of 2 padded batches each
    from_files = _batches(_pipeline(make_cfg, folder, shard_id=shard_id, is_training=False), passes)
    once = ("pipeline.options.decode_once=true",)
    from_memory = _batches(_pipeline(make_cfg, folder, shard_id=shard_id, is_training=False, overrides=once), passes)
    for (files_images, files_labels), (memory_images, memory_labels) in zip(from_files, from_memory):
        np.testing.assert_array_equal(memory_labels, files_labels)
        np.testing.assert_array_equal(memory_images, files_images)
    assert len({int(label) for _, labels in from_memory for label in labels}) == 3 + shard_id  # the shard's own


def _files_training_shard(make_cfg, root, shard_id: int = 1) -> set[int]:
    """The labels the files' training pipeline of shard `shard_id` reads in 8 batches (passes of the shard)."""
    stream = _batches(_pipeline(make_cfg, root, shard_id=shard_id, overrides=PLAIN), 8)
    return {int(label) for _, labels in stream for label in labels}


def _training_reference(make_cfg, folder):
    """The split's training images as the files' validation pipeline normalizes them (one shard), by label."""
    steps = -(-IMAGES // BATCH)
    pipe = _pipeline(make_cfg, folder, shard_id=0, num_shards=1, is_training=False, val_split="train")
    return {int(label): image for images, labels in _batches(pipe, steps) for image, label in zip(images, labels)}


def test_each_training_pass_reads_every_image_of_the_shard_once_in_a_fresh_order(make_cfg, folder):
    reference = _training_reference(make_cfg, folder)
    shard = sorted(_files_training_shard(make_cfg, folder))  # shard 1 of 2: 4 images, as the files give it
    assert len(shard) == 4
    once = (*PLAIN, "pipeline.options.decode_once=true")
    stream = _batches(_pipeline(make_cfg, folder, overrides=once), 8)  # 24 samples: 6 passes of 4
    images = np.concatenate([batch for batch, _ in stream])
    labels = np.concatenate([batch for _, batch in stream])
    orders = [tuple(labels[p * len(shard) : (p + 1) * len(shard)]) for p in range(6)]
    for order in orders:
        assert sorted(order) == shard
    assert len(set(orders)) > 1, orders  # 6 passes in one order: 1 in 24^5
    for image, label in zip(images, labels):
        np.testing.assert_array_equal(image, reference[int(label)])
    other_seed = _batches(_pipeline(make_cfg, folder, overrides=once, seed=2), 8)
    assert not np.array_equal(np.concatenate([batch for _, batch in other_seed]), labels)


@pytest.mark.parametrize("pad_mode, numpy_mode", [("reflect", "reflect"), ("zero", None)])
def test_training_from_memory_crops_a_random_window_of_the_padded_image(make_cfg, folder, pad_mode, numpy_mode):
    pad = 4
    reference = _training_reference(make_cfg, folder)
    overrides = (*PLAIN, "pipeline.options.decode_once=true", f"pipeline.options.pad={pad}")
    stream = _batches(_pipeline(make_cfg, folder, overrides=(*overrides, f"pipeline.options.pad_mode={pad_mode}")), 8)
    offsets = set()
    for images, labels in stream:
        for image, label in zip(images, labels):
            normalized = reference[int(label)]
            if numpy_mode is None:  # zeros before normalization: the normalized value of a black pixel
                black = _black(make_cfg)
                padded = np.pad(normalized - black, ((pad, pad), (pad, pad), (0, 0))) + black
            else:  # normalization is per channel: padding the normalized image mirrors the same pixels
                padded = np.pad(normalized, ((pad, pad), (pad, pad), (0, 0)), mode=numpy_mode)
            windows = [
                (top, left)
                for top in range(2 * pad + 1)
                for left in range(2 * pad + 1)
                if np.allclose(padded[top : top + SIDE, left : left + SIDE], image, atol=1e-5)
            ]
            assert windows, f"image {label} is no {SIDE} x {SIDE} window of its {pad_mode}-padded self"
            offsets.update(windows)
    assert len(offsets) > 5, offsets  # 24 crops at 81 equally likely offsets


def _black(make_cfg) -> np.ndarray:
    """A black pixel normalized with the recipe's mean and std."""
    options = make_cfg("pipeline=small_images").pipeline.options
    return -np.asarray(options.mean, np.float32) / np.asarray(options.std, np.float32)


def test_the_replicas_shards_hold_the_images_the_files_give_them_disjoint_and_together_the_split(make_cfg, folder):
    once = (*PLAIN, "pipeline.options.decode_once=true")
    shards = [
        {
            int(label)
            for _, labels in _batches(_pipeline(make_cfg, folder, overrides=once, shard_id=s), 4)
            for label in labels
        }
        for s in range(SHARDS)
    ]
    assert shards == [_files_training_shard(make_cfg, folder, s) for s in range(SHARDS)]
    assert [len(shard) for shard in shards] == [3, 4]  # DALI's shard bounds: [N * s / S, N * (s + 1) / S)
    assert shards[0] | shards[1] == set(range(IMAGES))


def test_every_replicas_training_shard_holds_every_class_of_folders_listed_class_by_class(make_cfg, tmp_path):
    """A folder lists its files class by class: its training shards are drawn from the whole list (DALI's reader
    shuffles it with one seed before sharding), as the files' pipelines read them. Decoded in file order, replica 0
    held only the first classes and replica 1 the others; under DDP each replica's BatchNorm statistics then told
    the halves apart (experiment=cifar10 on 2 GPUs: best val/acc 0.43 where one GPU reaches 0.917)."""
    from PIL import Image

    classes, per_class = 4, 8
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        for c in range(classes):
            (tmp_path / split / f"c{c}").mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, size=(SIDE, SIDE, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / f"c{c}" / f"{i}.jpg")
    once = (*PLAIN, "pipeline.options.decode_once=true")
    steps = -(-classes * per_class // SHARDS // BATCH)  # one pass of a shard
    for shard_id in range(SHARDS):
        stream = _batches(_pipeline(make_cfg, tmp_path, overrides=once, shard_id=shard_id), steps)
        seen = {int(label) for _, labels in stream for label in labels}
        assert seen == set(range(classes)), f"replica {shard_id} trains on classes {sorted(seen)} only"


def test_a_pipeline_restored_from_dalis_checkpoint_continues_the_same_stream(make_cfg, folder):
    once = ("pipeline.options.decode_once=true", "pipeline.options.cutout=8")  # pad, flip, cutout: random too
    pipe = _pipeline(make_cfg, folder, overrides=once, checkpointing=True)
    _batches(pipe, 5)  # into the fourth pass
    state = pipe.checkpoint()
    uninterrupted = _batches(pipe, 4)
    resumed = _batches(_pipeline(make_cfg, folder, overrides=once, checkpointing=True, restore=state), 4)
    for (images, labels), (again_images, again_labels) in zip(uninterrupted, resumed):
        np.testing.assert_array_equal(again_labels, labels)
        np.testing.assert_array_equal(again_images, images)


def test_a_process_decodes_each_split_of_a_shard_once_for_all_its_pipelines_and_runs(make_cfg, tmp_path, caplog):
    """One task's four pipelines, then another task's (the next run of a sweep in the same process): each split
    decoded once; a third task of another seed takes it from memory too (with a shuffle buffer of one, the files'
    order does not depend on the seed)."""
    write_one_image_per_class(tmp_path, IMAGES, size=SIDE)  # a folder of its own: no earlier test decoded it
    once = ("pipeline.options.decode_once=true",)
    with caplog.at_level("INFO", logger="hydrali"):
        for task in (_task(), _task()):
            for is_training in (True, False, True, False):
                _pipeline(make_cfg, tmp_path, task=task, overrides=once, is_training=is_training)
        _pipeline(make_cfg, tmp_path, task=_task(), overrides=once, is_training=True, seed=7)
    decoded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decoded")]
    assert len(decoded) == 2, decoded
    assert "the training split's 4 images" in decoded[0] and "the validation split's 4 images" in decoded[1]
    kept = [
        r.getMessage() for r in caplog.records if "decoded once by an earlier run of this process" in r.getMessage()
    ]
    assert len(kept) == 3, kept  # the second task's training and validation splits, the third's training split


def test_a_recipe_without_the_option_or_a_set_too_large_for_memory_is_one_line_naming_it(make_cfg, folder):
    with pytest.raises(HydraliError, match="pipeline.options.decode_once is not an option of recipe standard"):
        cfg = make_cfg("pipeline=standard", "+pipeline.options.decode_once=true")
        from hydrali.core.data.pipelines import check_options

        check_options(cfg.pipeline.recipe, OmegaConf.to_container(cfg.pipeline.options))
    from hydrali.core.data.decoded import check_fits

    with pytest.raises(HydraliError, match=r"need 2861\.0 GiB decoded .* pass pipeline.options.decode_once=false"):
        check_fits(10**9, 32, "training")


def test_eval_predict_and_export_read_the_files_and_give_the_batches_validation_scored(make_cfg, folder):
    """hydrali eval, predict and export build the validation pipeline through core.inference.batches: of a run
    that trained decoded once it reads the files (DALI serializes it for serving, where no Python feeds it), and its
    batches are those the run's validation read from memory."""
    from nvidia.dali import Pipeline

    from hydrali.core.inference.batches import validation_pipeline
    from hydrali.tasks.classification.datasets import scan_image_folder

    once = ("pipeline.options.decode_once=true",)
    cfg = make_cfg("pipeline=small_images", *once, f"data.batch_size={BATCH}", f"data.image_size={SIDE}")
    dataset = scan_image_folder(folder)
    exported = validation_pipeline(task=_task(), cfg=cfg, dataset=dataset, layout="HWC", device="cpu").serialize()
    served = Pipeline.deserialize(serialized_pipeline=exported, batch_size=BATCH, num_threads=1, device_id=None)
    served.build()
    steps = -(-IMAGES // BATCH)  # the whole split: one shard
    scored = _batches(_pipeline(make_cfg, folder, overrides=once, is_training=False, shard_id=0, num_shards=1), steps)
    for (images, labels), (served_images, served_labels) in zip(scored, _batches(served, steps)):
        np.testing.assert_array_equal(served_labels, labels)
        np.testing.assert_array_equal(served_images, images)
