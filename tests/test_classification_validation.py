"""The classification task's validation (tasks/classification/validation.py): top-1 accuracy computed once, in NumPy,
from each sample's top-1 class, the shard's padding skipped and every process's counts gathered; fed by the torch
side and by the Keras side, whose val/acc after real training is the accuracy of the trained network's own
predictions on the validation images."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from hydrali.core.distributed import gather
from hydrali.tasks.classification.validation import ClassificationValidation
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY
from tests.test_gather import ThreadSum, on_threads

# Three processes' validation batches: (top-1 classes, labels, weights; 0: the shard's padding, None: none).
# Counted by hand, real samples only:
#   process 0, batch 1: classes 1 2 3 | 0 against 1 0 3 | 0, the last padding: 2 hits of 3 (the padding would hit)
#   process 0, batch 2: classes 5 6 against 5 9, no padding: 1 hit of 2
#   process 1: classes 4 4 against 4 5, no weights: 1 hit of 2
#   process 2: a batch of padding only, both would hit: 0 of 0
# Over the job: 4 hits of 7 samples.
BATCHES = [
    [([1, 2, 3, 0], [1, 0, 3, 0], [1.0, 1.0, 1.0, 0.0]), ([5, 6], [[5], [9]], [1.0, 1.0])],
    [(np.array([4, 4]), np.array([[4], [5]]), None)],
    [([7, 7], [7, 7], [0.0, 0.0])],
]
HITS, SAMPLES = 4, 7
OWN = [(3, 5), (1, 2), (0, 0)]  # each process's (hits, samples) alone, by the same count


def _fed(batches) -> ClassificationValidation:
    validation = ClassificationValidation()
    for predicted, labels, weights in batches:
        validation.add_batch(predicted, labels, weights)
    return validation


def test_the_accuracy_counts_real_samples_only():
    for batches, (hits, samples) in zip(BATCHES, OWN, strict=True):
        validation = _fed(batches)
        assert validation.collected() == (hits, samples)
    alone = _fed(BATCHES[0])
    assert alone.finish(epoch=0) == {"val/acc": pytest.approx(3 / 5)}
    assert alone.collected() == (0, 0), "finish starts the next validation afresh"
    assert np.isnan(alone.finish(epoch=1)["val/acc"]), "no sample: no accuracy"


def test_a_batch_returns_its_real_samples_and_refuses_mismatched_lengths():
    validation = ClassificationValidation()
    assert validation.add_batch([1, 2, 3, 0], [1, 0, 3, 0], [1.0, 1.0, 1.0, 0.0]) == 3
    with pytest.raises(ValueError, match="3 predicted classes for 2 labels"):
        validation.add_batch([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="2 weights for 3 samples"):
        validation.add_batch([1, 2, 3], [1, 2, 3], [1.0, 0.0])


@pytest.mark.parametrize("collective", ["bytes", "sum"])
def test_every_process_reports_the_accuracy_over_every_processs_samples(collective):
    """Three processes (threads meeting in a collective of the test's own): each gathers every process's counts and
    reports the job's accuracy; through a collective of bytes (torch.distributed's kind) or of int32 sums
    (TensorFlow's kind)."""
    count = len(BATCHES)
    summing = ThreadSum(count)
    shares: dict[int, bytes] = {}

    def through_bytes(rank: int):
        def all_gather_bytes(data: bytes) -> list[bytes]:
            shares[rank] = data
            summing.barrier.wait()
            everyone = [shares[r] for r in range(count)]
            summing.barrier.wait()
            return everyone

        return all_gather_bytes

    def one_process(rank: int) -> dict:
        validation = _fed(BATCHES[rank])
        if collective == "bytes":
            validation.gather_across_processes(through_bytes(rank))
        else:
            validation.gather_across_processes(gather.all_gather_through_sum(summing.for_rank(rank), rank, count))
        return validation.finish(epoch=0)

    assert on_threads(count, one_process) == [{"val/acc": pytest.approx(HITS / SAMPLES)}] * count


def test_a_process_alone_keeps_its_own_counts():
    validation = _fed(BATCHES[0])
    validation.gather_across_processes()  # no collective installed: this process alone
    assert validation.finish(epoch=0) == {"val/acc": pytest.approx(3 / 5)}


def test_the_torch_side_feeds_each_batchs_top_one_classes():
    import torch

    from hydrali.tasks.classification.torch_task import TorchClassification

    classes = 10
    side = TorchClassification(torch.nn.Identity(), classes).eval()  # the images are the logits
    # the largest logit of each row: 2, 0, 7 against labels 2, 1, 7 (2 hits of 3); then 4 against 4 (1 of 1)
    first = torch.zeros(3, classes)
    first[0, 2] = first[1, 0] = first[2, 7] = 1.0
    second = torch.zeros(1, classes)
    second[0, 4] = 1.0
    with torch.inference_mode():
        side.validation_step({"images": first, "labels": torch.tensor([[2], [1], [7]], dtype=torch.int32)})
        _, n = side.validation_step({"images": second, "labels": torch.tensor([[4]], dtype=torch.int32)})
    assert n == 1
    assert side.val_metrics_compute(epoch=0) == {"val/acc": pytest.approx(3 / 4)}
    with torch.inference_mode():
        side.validation_step({"images": second, "labels": torch.tensor([[5]], dtype=torch.int32)})
    side.val_metrics_reset()  # e.g. after Lightning's sanity check: its batches are forgotten
    with torch.inference_mode():
        side.validation_step({"images": second, "labels": torch.tensor([[4]], dtype=torch.int32)})
    assert side.val_metrics_compute(epoch=1) == {"val/acc": pytest.approx(1.0)}


@pytest.mark.keras
def test_the_keras_side_skips_the_padding_its_test_step_weighs_out_and_logs_val_acc():
    from types import SimpleNamespace

    import tensorflow as tf

    from hydrali.tasks.classification.keras_task import KerasClassification

    side = KerasClassification(SimpleNamespace(label_smoothing=0.0, flip_averaging=False))
    (callback,) = side.callbacks()
    # the largest logit of each row: 2, 0, 7, 7 against labels 2, 1, 7, 7; the last is padding (weight 0): 2 of 3
    logits = np.zeros((4, 10), "float32")
    logits[0, 2] = logits[1, 0] = logits[2, 7] = logits[3, 7] = 1.0
    labels = np.array([[2], [1], [7], [7]], "int32")

    @tf.function
    def test_step(images, labels, weights):  # in the graph, as Keras' test step calls it
        side.on_val_batch((images, labels), images, weights)

    callback.on_test_begin()
    test_step(tf.constant(logits), tf.constant(labels), tf.constant([1.0, 1.0, 1.0, 0.0]))
    logs = {"loss": 0.5, "val_loss": 0.7, "val_acc": -1.0}  # val_acc: the training metric's value, replaced
    callback.on_epoch_end(0, logs)
    assert logs == {"loss": 0.5, "val_loss": 0.7, "val_acc": pytest.approx(2 / 3)}
    unvalidated = {"loss": 0.4}
    callback.on_epoch_end(1, unvalidated)
    assert unvalidated == {"loss": 0.4}, "an epoch that did not validate gains no val_acc"


# ---------------------------------------------------------------- real training on each backend

VAL_IMAGES = 360  # the digits' validation split


def _accuracy_of_predictions(run_dir: Path, data_dir: Path, out: Path, capsys) -> tuple[float, int]:
    """`hydrali predict` of the run's checkpoint over the digits' validation images (one folder per digit): the share
    of images whose first class is their folder's, and the number of images."""
    from hydrali.core.cli.use import run_command

    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        run_command("predict", [str(run_dir), f"source={data_dir / 'digits' / 'val'}", "top_k=1", f"out={out}"])
    assert ended.value.code == 0, capsys.readouterr().err[-3000:]
    with (out / "predictions.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    right = sum(Path(row["file"]).parts[0] == row["class_1"] for row in rows)
    return right / len(rows), len(rows)


@pytest.mark.slow
@pytest.mark.keras
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param(["backend=lightning", *LIGHTNING_QUIET], id="lightning"),
        # 2 replicas: shards of 180, validation batches of 64: each shard's last batch holds 12 images of padding
        pytest.param(["backend=keras", "backend.devices=2", *KERAS_QUIET], id="keras-2-replicas"),
    ],
)
def test_val_acc_after_training_is_the_accuracy_of_the_trained_networks_predictions(
    make_cfg, data_dir, tmp_path, capsys, backend
):
    from hydrali.core.run.runner import run
    from tests.support.checks import read_summary

    cfg = make_cfg("epochs=1", "tracking=none", *TINY, *backend)
    run(cfg)
    summary = read_summary(cfg.paths.output_dir)
    (row,) = summary["history"]
    assert row["val/images"] == VAL_IMAGES
    accuracy, images = _accuracy_of_predictions(Path(cfg.paths.output_dir), data_dir, tmp_path / "predicted", capsys)
    assert images == VAL_IMAGES
    assert 0.0 < accuracy < 1.0, "a network part-trained: right and wrong predictions both count"
    # Lightning logs its metrics as float32: within far less than one image's share (1 / 360)
    assert row["val/acc"] == pytest.approx(accuracy, abs=1e-6)
