"""Mixup and cutmix inside DALI (tasks/classification/mixing.py): a mixed batch's labels are soft targets summing to
1, its images are the pairs (i, B-1-i) mixed as those labels say, the recipes and the task declare the soft labels,
and both backends' losses agree on them.

A test pipeline reads real JPEG files (each its own class, so partners' labels differ and a sample's mixing weight
can be read back from its soft label) and returns the batch before and after mix_batch, from the same run."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

SIDE, BATCH, CLASSES = 16, 8, 10  # BATCH images, each its own class, of CLASSES classes (two never read)
NUMPY_DTYPES = {"float": "float32", "int32": "int32"}  # output_specs' dtype names (pipeline.dtype's) as NumPy's


@pytest.fixture
def photos(tmp_path):
    """A dataset root whose train/ and val/ hold BATCH class folders of one JPEG each, of SIDE x SIDE blocks."""
    rng = np.random.default_rng(3)
    for split in ("train", "val"):
        for label in range(BATCH):
            folder = tmp_path / split / f"c{label}"
            folder.mkdir(parents=True)
            blocks = np.kron(rng.integers(0, 256, (SIDE // 2, SIDE // 2, 3)), np.ones((2, 2, 1)))
            Image.fromarray(blocks.astype(np.uint8)).save(folder / "image.jpg", quality=95)
    return tmp_path


def _before_and_after(root, seed: int = 5, **mixing):
    """(images, labels, mixed images, soft labels) of one batch, as NumPy (HWC float images; labels (B,))."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    from hydrali.tasks.classification.mixing import Mixing, mix_batch

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=seed)
    def before_and_after():
        jpegs, labels = fn.readers.file(file_root=str(root / "train"), random_shuffle=False)
        images = fn.cast(fn.decoders.image(jpegs, output_type=types.RGB), dtype=types.FLOAT)
        mixed, soft = mix_batch(
            images, labels, Mixing(**mixing), num_classes=CLASSES, side=SIDE, layout="HWC", device="cpu"
        )
        return images, labels, mixed, soft

    pipe = before_and_after()
    pipe.build()
    images, labels, mixed, soft = (np.asarray(out.as_array()) for out in pipe.run())
    return images, labels.reshape(-1), mixed, soft


def _mixing_weights(labels: np.ndarray, soft: np.ndarray) -> np.ndarray:
    """Each sample's own share lam_i, read back from its soft label (checked to be lam at its class, 1 - lam at its
    partner's, 0 elsewhere)."""
    lam = soft[np.arange(BATCH), labels]
    expected = np.zeros_like(soft)
    expected[np.arange(BATCH), labels] = lam
    expected[np.arange(BATCH), labels[::-1]] = 1 - lam
    np.testing.assert_allclose(soft, expected, atol=1e-6)
    return lam


def test_the_labels_are_soft_targets_summing_to_one(photos):
    _, labels, _, soft = _before_and_after(photos, mixup_alpha=0.4, cutmix_alpha=1.0)
    assert soft.shape == (BATCH, CLASSES) and soft.dtype == np.float32
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, atol=1e-6)
    lam = _mixing_weights(labels, soft)
    assert np.all((lam >= 0) & (lam <= 1)) and len(np.unique(lam)) > 1


def test_mixup_blends_each_image_with_the_reversed_batchs_as_its_label_says(photos):
    images, labels, mixed, soft = _before_and_after(photos, mixup_alpha=0.4)
    lam = _mixing_weights(labels, soft)
    assert np.all(lam < 1 - 1e-3), f"unmixed samples at mix_probability=1: {lam}"
    expected = lam[:, None, None, None] * images + (1 - lam[:, None, None, None]) * images[::-1]
    np.testing.assert_allclose(mixed, expected, rtol=1e-5, atol=1e-3)


def _partner_box(own: np.ndarray, partner: np.ndarray, mixed: np.ndarray) -> int:
    """The area of the box that `mixed` took from `partner`, checking that every pixel is own's or partner's and
    that those from partner (where the two differ) are one rectangle with nothing of own's inside it."""
    is_own, is_partner = (np.all(mixed == image, axis=-1) for image in (own, partner))
    assert np.all(is_own | is_partner), "a pixel that is neither the image's nor its partner's"
    taken = is_partner & ~is_own
    if not taken.any():
        return 0
    rows, cols = np.nonzero(taken)
    top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    assert is_partner[top:bottom, left:right].all(), "the partner's pixels are not one rectangle"
    return int((bottom - top) * (right - left))


@pytest.mark.parametrize("seed", [5, 6])
def test_cutmix_pastes_a_box_of_the_partner_whose_share_is_one_minus_the_labels_weight(photos, seed):
    images, labels, mixed, soft = _before_and_after(photos, seed=seed, cutmix_alpha=1.0)
    lam = _mixing_weights(labels, soft)
    areas = [_partner_box(images[i], images[BATCH - 1 - i], mixed[i]) for i in range(BATCH)]
    np.testing.assert_allclose(np.asarray(areas) / SIDE**2, 1 - lam, atol=1e-6)
    assert max(areas) > 0


def test_with_both_on_each_sample_is_a_cutmix_or_a_mixup(photos):
    images, labels, mixed, soft = _before_and_after(photos, mixup_alpha=1.0, cutmix_alpha=1.0)
    lam = _mixing_weights(labels, soft)
    kinds = set()
    for i in range(BATCH):
        blend = lam[i] * images[i] + (1 - lam[i]) * images[BATCH - 1 - i]
        if np.allclose(mixed[i], blend, rtol=1e-5, atol=1e-3) and not np.array_equal(mixed[i], images[i]):
            kinds.add("mixup")
        else:
            assert _partner_box(images[i], images[BATCH - 1 - i], mixed[i]) / SIDE**2 == pytest.approx(1 - lam[i])
            kinds.add("cutmix")
    assert kinds == {"mixup", "cutmix"}


def test_a_mix_probability_of_zero_leaves_the_batch_and_one_hot_labels(photos):
    images, labels, mixed, soft = _before_and_after(photos, mixup_alpha=1.0, cutmix_alpha=1.0, mix_probability=0.0)
    np.testing.assert_array_equal(mixed, images)
    np.testing.assert_array_equal(soft, np.eye(CLASSES, dtype=np.float32)[labels])


def _task_and_dataset(root):
    from hydrali.tasks.classification.datasets import scan_image_folder
    from hydrali.tasks.classification.task import ClassificationTask

    task = ClassificationTask(name="classification", monitor="val/acc", mode="max", sides={}, label_smoothing=0.0)
    return task, scan_image_folder(root)


def _task_pipeline(make_cfg, root, is_training: bool, *overrides: str):
    """The task's small_images pipeline of one split (built and run once), and the task."""
    task, dataset = _task_and_dataset(root)
    cfg = make_cfg("pipeline=small_images", *overrides)
    plan = SimpleNamespace(per_replica_batch=BATCH, num_shards=1, device="cpu")
    shard = SimpleNamespace(shard_id=0, device_id=None, pipeline_seed=1)
    pipe = task.build_pipeline(
        pipeline=cfg.pipeline,
        data=OmegaConf.create({"image_size": SIDE}),
        model=cfg.model,
        dataset=dataset,
        plan=plan,
        shard=shard,
        layout="HWC",
        is_training=is_training,
    )
    return task, pipe


def test_the_task_declares_soft_training_labels_as_its_recipe_outputs_them(make_cfg, photos):
    mixing = ("pipeline.options.mixup_alpha=0.2", "pipeline.options.cutmix_alpha=1.0")
    specs = {"batch": BATCH, "image_size": SIDE, "image_dtype": "float32", "model": None}
    for overrides, is_training, label_spec in [
        (mixing, True, ((BATCH, BATCH), "float")),  # the dataset's classes: its BATCH class folders
        (mixing, False, ((BATCH, 1), "int32")),
        ((), True, ((BATCH, 1), "int32")),
    ]:
        task, pipe = _task_pipeline(make_cfg, photos, is_training, *overrides)
        pipe.build()
        labels = np.asarray(pipe.run()[1].as_array())
        assert task.output_specs(is_training=is_training, **specs)[1] == label_spec
        assert (labels.shape, NUMPY_DTYPES[label_spec[1]]) == (label_spec[0], str(labels.dtype))
        if is_training and overrides:
            np.testing.assert_allclose(labels.sum(axis=1), 1.0, atol=1e-6)


def test_a_mixing_option_out_of_range_is_one_line_naming_it(make_cfg, photos):
    from hydrali.core.errors import HydraliError

    with pytest.raises(HydraliError, match=r"pipeline.options.mix_probability=1.5: pass a value in \[0, 1\]"):
        _task_pipeline(
            make_cfg, photos, True, "pipeline.options.cutmix_alpha=1.0", "pipeline.options.mix_probability=1.5"
        )


def _soft_batch(smoothing_classes: int = 5, batch: int = 6):
    """Logits and soft targets (rows summing to 1, two classes each as mixing gives them) of a batch."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(batch, smoothing_classes)).astype("float32") * 2
    lam = rng.uniform(size=batch).astype("float32")
    labels = rng.integers(0, smoothing_classes, size=batch)
    eye = np.eye(smoothing_classes, dtype="float32")
    return logits, lam[:, None] * eye[labels] + (1 - lam[:, None]) * eye[labels[::-1]]


def _expected_loss(logits, target, smoothing: float, class_weights) -> float:
    """Cross-entropy against the smoothed soft target, each sample weighted by target . class weights, averaged."""
    classes = logits.shape[1]
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    per_sample = -(((1 - smoothing) * target + smoothing / classes) * log_probs).sum(axis=1)
    weights = target @ np.asarray(class_weights) if class_weights else 1.0
    return float(np.mean(per_sample * weights))


@pytest.mark.keras
@pytest.mark.parametrize("smoothing, class_weights", [(0.0, None), (0.1, None), (0.2, [1.0, 2.0, 0.5, 3.0, 1.0])])
def test_torch_and_keras_give_the_soft_target_loss_on_a_mixed_batch(smoothing, class_weights):
    import torch

    from hydrali.tasks.classification.keras_task import CrossEntropy
    from hydrali.tasks.classification.torch_task import TorchClassification

    logits, target = _soft_batch()
    side = TorchClassification(torch.nn.Identity(), target.shape[1], smoothing, class_weights)
    torch_loss, samples = side.training_loss({"images": torch.from_numpy(logits), "labels": torch.from_numpy(target)})
    keras_loss = CrossEntropy(smoothing, class_weights)(target, logits)
    expected = _expected_loss(logits, target, smoothing, class_weights)
    assert samples == len(target)
    assert float(torch_loss) == pytest.approx(expected, rel=1e-5)
    assert float(keras_loss) == pytest.approx(expected, rel=1e-5)


@pytest.mark.keras
def test_keras_accuracy_takes_class_indices_and_soft_targets_alike():
    from hydrali.tasks.classification.keras_task import TopOneAccuracy

    logits, target = _soft_batch()
    largest = target.argmax(axis=1)
    expected = float(np.mean(logits.argmax(axis=1) == largest))
    for labels in (target, largest.reshape(-1, 1).astype("int32")):
        metric = TopOneAccuracy()
        metric.update_state(labels, logits)
        assert float(metric.result()) == pytest.approx(expected)


@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])
def test_a_run_with_mixup_and_cutmix_trains_on_each_backend(make_cfg, tmp_path, backend):
    """An epoch of the bundled digits with mixup and cutmix trains through each backend's own loader (CHW on
    Lightning, HWC on Keras) and validation scores the plain images. On Lightning, the loss of every training step
    is the cross-entropy, computed here by hand, of the network's logits against the batch's soft targets, mixed
    pairs of classes, and not against its largest classes: the mixed targets reach the loss. (Keras' loss on soft
    targets: test_torch_and_keras_give_the_soft_target_loss_on_a_mixed_batch.)"""
    import json

    from hydrali.core.run.runner import run
    from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, SMALL_NET, with_plugin_callback

    terms = tmp_path / "loss_terms.npz"
    record = [
        "model._target_=tests.support.plugins.torch_model_without_batchnorm",  # its logits, a step's only randomness
        "+model.record_logits=mixing",
        with_plugin_callback("terms", "RecordLossTerms", path=str(terms), logits="mixing"),
    ]
    cfg = make_cfg(
        *SMALL_NET,
        *(LIGHTNING_QUIET + record if backend == "lightning" else KERAS_QUIET),
        f"backend={backend}",
        "pipeline=small_images",
        "pipeline.options.mixup_alpha=1.0",
        "pipeline.options.cutmix_alpha=1.0",
        "task.label_smoothing=0",
        "epochs=1",
        "tracking=none",
        "data.verify=off",
        output_dir=tmp_path / "run",
    )
    run(cfg)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    last = summary["history"][-1]
    assert np.isfinite(last["train/loss"]) and 0 <= last["val/acc"] <= 1 and last["val/images"] > 0
    if backend == "lightning":
        _check_the_loss_is_against_the_soft_targets(np.load(terms))


def _check_the_loss_is_against_the_soft_targets(steps) -> None:
    """Each step's loss is its cross-entropy against the soft targets, which mix two classes in most samples, and
    is not the cross-entropy against each sample's largest class."""
    labels, logits, losses = steps["labels"], steps["logits"], steps["losses"]
    assert labels.ndim == 3 and labels.shape == logits.shape and len(losses) > 1, (labels.shape, logits.shape)
    np.testing.assert_allclose(labels.sum(axis=-1), 1.0, atol=1e-5)
    mixed = np.mean((labels > 1e-6).sum(axis=-1) == 2)
    assert mixed > 0.5, f"only {mixed:.0%} of the samples have a target of two classes"
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    soft = -(labels * log_probs).sum(axis=-1).mean(axis=-1)
    hard = -np.take_along_axis(log_probs, labels.argmax(axis=-1)[..., None], axis=-1).mean(axis=(1, 2))
    np.testing.assert_allclose(losses, soft, rtol=2e-5, err_msg="the loss is not against the soft targets")
    # a network of one epoch is near chance on every class, so the two differ by little: far more than round-off
    assert np.abs(soft - hard).mean() > 10 * np.abs(losses - soft).max(), "the largest classes' loss is as close"
