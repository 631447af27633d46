"""task.flip_averaging (test-time flip averaging) on both backends: the class probabilities scored are the mean of the
network's softmax on the images and on the images mirrored left-right, p = (softmax(f(x)) + softmax(f(flip(x)))) / 2,
and the task's logits are log(p): in validation (val/acc = argmax p, val/loss = the cross-entropy of p), in `hydrali
eval`. The two passes are computed here by calling the network itself on images flipped with NumPy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytestmark = pytest.mark.keras

CLASSES, BATCH, SIZE = 5, 16, 8


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def _mean_of_passes(plain: np.ndarray, mirrored: np.ndarray) -> np.ndarray:
    """The class probabilities flip averaging scores, from the logits of the two passes."""
    return (_softmax(plain.astype(np.float64)) + _softmax(mirrored.astype(np.float64))) / 2


def _images(layout: str) -> np.ndarray:
    """A batch of random images (no image is its own mirror), NCHW or NHWC."""
    images = np.random.default_rng(0).normal(size=(BATCH, SIZE, SIZE, 3)).astype("float32")
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)) if layout == "NCHW" else images


def _labels_that_tell_the_passes_apart(plain: np.ndarray, averaged: np.ndarray) -> np.ndarray:
    """Labels = the averaged prediction: accuracy 1 with flip averaging, less on the plain pass (checked)."""
    labels = np.argmax(averaged, axis=1)
    assert np.any(np.argmax(plain, axis=1) != labels), "the batch does not tell the two scorings apart"
    return labels


def _expected_scores(probabilities: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(val/loss, val/acc) of probabilities p: the mean cross-entropy of p and the top-1 accuracy of argmax p."""
    loss = float(np.mean(-np.log(probabilities[np.arange(len(labels)), labels])))
    return loss, float(np.mean(np.argmax(probabilities, axis=1) == labels))


def test_torch_validation_and_predict_score_the_mean_of_the_two_passes_probabilities():
    import torch

    from hydrali.tasks.classification.torch_task import TorchClassification

    torch.manual_seed(0)
    network = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, CLASSES)
    ).eval()
    images = _images("NCHW")
    with torch.no_grad():
        plain = network(torch.from_numpy(images)).numpy()
        mirrored = network(torch.from_numpy(np.ascontiguousarray(images[..., ::-1]))).numpy()  # W is the last axis
    averaged = _mean_of_passes(plain, mirrored)
    labels = _labels_that_tell_the_passes_apart(plain, averaged)
    batch = {"images": torch.from_numpy(images), "labels": torch.from_numpy(labels.reshape(-1, 1).astype("int32"))}

    side = TorchClassification(network, CLASSES, flip_averaging=True).eval()
    with torch.no_grad():
        logits = side.evaluation_logits(batch["images"]).numpy()
        loss, seen = side.validation_step(batch)
        predicted = side.predict(batch)["logits"].numpy()
        served = side.serving(batch)["logits"].numpy()
    np.testing.assert_allclose(logits, np.log(averaged), rtol=1e-5, atol=1e-5)
    assert not np.allclose(logits, plain, atol=1e-3)
    np.testing.assert_allclose(predicted, logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(served, plain, rtol=1e-6, atol=1e-6)  # hydrali export: the plain network
    expected_loss, expected_acc = _expected_scores(averaged, labels)
    assert seen == BATCH and float(loss) == pytest.approx(expected_loss, rel=1e-5)
    assert float(side.val_metrics_compute(0)["val/acc"]) == pytest.approx(expected_acc) == 1.0

    plain_side = TorchClassification(network, CLASSES).eval()  # the default: the plain pass, as before
    with torch.no_grad():
        np.testing.assert_allclose(plain_side.evaluation_logits(batch["images"]).numpy(), plain, atol=1e-6)
        plain_side.validation_step(batch)
    assert float(plain_side.val_metrics_compute(0)["val/acc"]) < 1.0


def _keras_network():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(CLASSES),
        ]
    )


def _keras_validation(network, side, images: np.ndarray, labels: np.ndarray):
    """(the validation logits, evaluate's logs) of the Keras backend's TaskModel over `network`, the task's
    evaluation forward pass handed to it as compile_task_model hands it."""
    from hydrali.backends.keras.model import TaskModel

    model = TaskModel(network, [BATCH], BATCH, evaluation_forward=side.evaluation_forward)
    model(np.zeros((1, SIZE, SIZE, 3), "float32"))
    model.compile(loss=side.loss(), weighted_metrics=side.metrics())
    logs = model.evaluate(images, labels.reshape(-1, 1).astype("int32"), batch_size=BATCH, verbose=0, return_dict=True)
    return np.asarray(model._forward(images)), logs


def test_keras_validation_and_predict_score_the_mean_of_the_two_passes_probabilities():
    from hydrali.tasks.classification.keras_task import KerasClassification

    network = _keras_network()
    images = _images("NHWC")
    plain = np.asarray(network(images, training=False))
    mirrored = np.asarray(network(np.ascontiguousarray(images[:, :, ::-1]), training=False))  # W is axis 2
    averaged = _mean_of_passes(plain, mirrored)
    labels = _labels_that_tell_the_passes_apart(plain, averaged)

    side = KerasClassification(SimpleNamespace(label_smoothing=0.0, flip_averaging=True))
    logits, logs = _keras_validation(network, side, images, labels)
    np.testing.assert_allclose(logits, np.log(averaged), rtol=1e-5, atol=1e-5)
    assert not np.allclose(logits, plain, atol=1e-3)
    expected_loss, expected_acc = _expected_scores(averaged, labels)
    assert logs["loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert logs["acc"] == pytest.approx(expected_acc) == 1.0
    predicted = np.asarray(side.predict(network, {"images": images})["logits"])
    np.testing.assert_allclose(predicted, logits, rtol=1e-5, atol=1e-6)
    served = np.asarray(side.serving(network, {"images": images})["logits"])
    np.testing.assert_allclose(served, plain, rtol=1e-6, atol=1e-6)  # hydrali export: the plain network

    plain_side = KerasClassification(SimpleNamespace(label_smoothing=0.0, flip_averaging=False))
    plain_logits, plain_logs = _keras_validation(network, plain_side, images, labels)
    np.testing.assert_allclose(plain_logits, plain, atol=1e-6)
    assert plain_logs["acc"] < 1.0


# `hydrali eval` on the session's shared runs (conftest.py: trained_on_both), each copied first: the eval writes into
# the copy, and logs to no MLflow run

BACKENDS = {"lightning": 3, "keras": 2}  # backend -> the width axis of its batches' images (NCHW, NHWC)


def _copy_of_run(trained, backend: str, tmp_path: Path) -> Path:
    copy = tmp_path / backend
    shutil.copytree(trained[0] / backend, copy, ignore=shutil.ignore_patterns("eval", "export"))
    return copy


def _eval(capsys, run: Path, *overrides: str) -> dict:
    """`hydrali eval <run> <overrides>` in this process, without MLflow: its metrics.json."""
    from hydrali.core.cli.use import run_command

    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        run_command("eval", [str(run), "tracking.enabled=false", *overrides])
    assert ended.value.code == 0, capsys.readouterr().err[-3000:]
    return json.loads((run / "eval/val/metrics.json").read_text())


def _two_passes(run: Path, width_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(the mean of the two passes' class probabilities, the labels) over the run's validation images: its trained
    network (flip averaging off) called on the images and on them mirrored by NumPy, as eval reads them."""
    from hydrali.core.config.store import register_schemas
    from hydrali.core.inference.loaded import load
    from hydrali.core.inference.schema import register_use_schemas
    from hydrali.core.inference.trained_run import open_run

    register_schemas()  # as `hydrali eval` does first
    register_use_schemas()
    trained = open_run("eval", str(run), ["task.flip_averaging=false", "tracking.enabled=false"])
    data = trained.cfg.data
    loaded = load(trained, lambda task: task.evaluation_data(data, "val", data.verify), "evaluation_data")
    averaged, labels = [], []
    for batch in loaded.batches("two passes"):
        plain = loaded.network.predict(batch)["logits"]
        flipped = np.ascontiguousarray(np.flip(batch["images"], axis=width_axis))
        mirrored = loaded.network.predict({**batch, "images": flipped})["logits"]
        averaged.append(_mean_of_passes(plain, mirrored))
        labels.append(np.asarray(batch["labels"]).reshape(-1))
    return np.concatenate(averaged), np.concatenate(labels)


def _confusion(probabilities: np.ndarray, labels: np.ndarray) -> list[list[int]]:
    counts = np.zeros((probabilities.shape[1],) * 2, dtype=int)
    np.add.at(counts, (labels, np.argmax(probabilities, axis=1)), 1)
    return counts.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_with_flip_averaging_scores_the_mean_of_the_two_passes(trained_on_both, tmp_path, capsys, backend):
    run = _copy_of_run(trained_on_both, backend, tmp_path)
    averaged, labels = _two_passes(run, BACKENDS[backend])
    plain = _eval(capsys, run)
    flipped = _eval(capsys, run, "task.flip_averaging=true")
    assert flipped["images"] == len(labels)
    assert flipped["confusion_matrix"] == _confusion(averaged, labels)
    assert flipped["metrics"]["val/acc"] == pytest.approx(float(np.mean(np.argmax(averaged, axis=1) == labels)))
    assert flipped["confusion_matrix"] != plain["confusion_matrix"]  # the mirror's pass changed predictions
