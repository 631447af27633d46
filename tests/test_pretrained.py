"""Pretrained backbones (model=timm): timm's weights files, written locally in timm's own layout (these machines
have no network), load into the same network on both frameworks (timm on Lightning, keras-hub's conversion on Keras);
the preprocessing follows the weights' config; a model whose weights cannot be had is one line; and weights trained
on digits 0-4 train digits 5-9 better than random ones, on each backend."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, compose_config
from tests.support.pretrained import (
    COMMIT,
    digits_classes,
    put_in_hub_cache,
    timm_network_of_checkpoint,
    write_timm_weights,
)
from tests.support.torch_networks import with_random_normalization

NAME = "resnet18.a1_in1k"  # a timm architecture keras-hub converts, with its hub tag
QUIET = {"lightning": LIGHTNING_QUIET, "keras": KERAS_QUIET}
# what the weights' config says of their preprocessing, none of it a default of hydrali's
WEIGHTS_PREPROCESSING = {"image_size": 24, "mean": [0.4, 0.45, 0.5], "std": [0.3, 0.25, 0.2], "crop_fraction": 0.8}


def _random_timm_network(num_classes: int = 10):
    """timm's resnet18 with random weights and BatchNorm statistics that differ from their defaults."""
    import timm
    import torch

    torch.manual_seed(0)
    return with_random_normalization(timm.create_model(NAME, num_classes=num_classes))


@pytest.fixture
def hub_cache(tmp_path):
    """A Hugging Face cache holding timm's files of NAME (random weights, WEIGHTS_PREPROCESSING's config)."""
    p = WEIGHTS_PREPROCESSING
    folder = write_timm_weights(
        _random_timm_network(), tmp_path / "weights", p["image_size"], p["mean"], p["std"], p["crop_fraction"]
    )
    return put_in_hub_cache(folder, tmp_path / "hf-cache", f"timm/{NAME}")


@pytest.mark.keras
def test_timm_weights_load_into_the_same_network_on_both_frameworks(tmp_path):
    import keras
    import torch

    from hydrali.tasks.classification.keras_hub_model import TimmNetwork as KerasTimm
    from hydrali.tasks.classification.timm_model import TimmNetwork as TorchTimm

    written = _random_timm_network()
    folder = write_timm_weights(written, tmp_path / "weights", 32, [0.5] * 3, [0.25] * 3, 0.9)
    images = np.random.default_rng(0).uniform(-1, 1, size=(2, 32, 32, 3)).astype("float32")
    as_torch = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
    with torch.no_grad():
        expected = written.forward_head(written.forward_features(as_torch), pre_logits=True).numpy()

    torch_net = TorchTimm(num_classes=5, name=NAME, weights=str(folder)).eval()
    keras_net = KerasTimm(num_classes=5, image_size=32, name=NAME, weights=str(folder))
    with torch.no_grad():
        torch_features = torch_net.forward_head(torch_net.forward_features(as_torch), pre_logits=True).numpy()
        assert torch_net(as_torch).shape == (2, 5), "a new head for the dataset's classes"
    keras_features = np.asarray(keras.Model(keras_net.inputs, keras_net.layers[-2].output)(images, training=False))
    assert keras_net.output_shape == (None, 5)

    assert np.abs(torch_features - expected).max() < 1e-5
    assert np.abs(keras_features - expected).max() < 1e-4, "keras-hub's conversion gives timm's features"
    random_keras = KerasTimm(num_classes=5, image_size=32, name=NAME)
    random_features = np.asarray(keras.Model(random_keras.inputs, random_keras.layers[-2].output)(images))
    assert np.abs(random_features - expected).max() > 0.1, "without the file the features differ"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_without_network_or_cached_weights_a_pretrained_model_is_one_line_naming_the_cache(tmp_path, backend):
    cache, run_dir = tmp_path / "empty-cache", tmp_path / "run"
    out = run_cli(
        "model=timm",
        "model.pretrained=true",
        f"backend={backend}",
        f"hydra.run.dir={run_dir}",
        "tracking=none",
        cwd=tmp_path,
        # a hub whose host does not resolve (RFC 6761's .invalid): no network, whatever the machine has
        env={"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": "https://hub.invalid"},
    )
    fails_with(out, f"{cache}/models--timm--{NAME}", f"hf download timm/{NAME}", "model.weights=")
    assert not run_dir.exists() and not cache.exists(), "nothing written"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_pretrained_weights_from_the_hub_cache_bring_their_preprocessing(tmp_path, data_dir, hub_cache, backend):
    from hydrali.tasks.classification.datasets import write_digits

    # two of the digits' classes (a fifth of the images): what is checked is what the run takes from the cache
    digits = digits_classes(write_digits(data_dir / "digits", size=32, val_fraction=0.2), tmp_path / "01", ["0", "1"])
    run_dir = tmp_path / "run"
    out = run_cli(
        "model=timm",
        "model.pretrained=true",
        "pipeline.options.std=[0.5,0.5,0.5]",  # given on the command line: it stays
        "optim.backbone_lr_mult=0",  # the backbone's weights stay as the file has them: compared below
        "epochs=1",
        "data=imagefolder",
        f"data.root={digits}",
        f"backend={backend}",
        *QUIET[backend],
        "tracking=none",
        f"paths.data_dir={data_dir}",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        env={"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    p = WEIGHTS_PREPROCESSING
    assert config["data"]["image_size"] == p["image_size"]
    assert config["pipeline"]["options"]["mean"] == p["mean"]
    assert config["pipeline"]["options"]["val_crop_fraction"] == p["crop_fraction"]
    assert config["pipeline"]["options"]["std"] == [0.5, 0.5, 0.5]
    assert "preprocessing of model.name=resnet18.a1_in1k's weights" in out.stdout  # logged
    assert read_summary(run_dir)["history"][-1]["val/acc"] > 0
    from safetensors.numpy import load_file

    cached = load_file(hub_cache / f"models--timm--{NAME}" / "snapshots" / COMMIT / "model.safetensors")
    trained = _trained_first_conv(run_dir, backend, num_classes=2)
    assert np.array_equal(trained, cached["conv1.weight"]), "trained from the cache's weights"


def _trained_first_conv(run_dir, backend: str, num_classes: int) -> np.ndarray:
    """The first convolution's kernel (torch's layout) in the last checkpoint of a model=timm run on `backend`."""
    if backend == "lightning":
        import torch

        state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        return state["state_dict"]["torch_task.model.conv1.weight"].numpy()
    network = _keras_network_of_checkpoint(run_dir, num_classes, image_size=WEIGHTS_PREPROCESSING["image_size"])
    return np.transpose(np.asarray(network.layers[1].get_layer("conv1_conv").kernel), (3, 2, 0, 1))


def _train(tmp_path, data_dir, backend: str, root, name: str, *extra: str) -> dict:
    """A model=timm run on the image folder `root`, in this process (what is checked is what the weights teach, not
    the command line: the runs above are `hydrali` commands), in tmp_path/<name>: its summary and "dir"."""
    from hydrali.core.run.runner import run

    run_dir = tmp_path / name
    overrides = [
        "model=timm",
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=32",
        "pipeline.options.flip_probability=0",  # digits are not mirror-symmetric
        "epochs=2",
        "seed=0",
        f"backend={backend}",
        *QUIET[backend],
        *extra,
        "tracking=none",
    ]
    run(compose_config(overrides, tmp_path, data_dir, output_dir=run_dir))
    return {"dir": run_dir, **read_summary(run_dir)}


def _keras_network_of_checkpoint(run_dir, num_classes: int, image_size: int):
    """The network of a hydrali Keras model=timm run's last checkpoint."""
    from hydrali.backends.keras.model import TaskModel
    from hydrali.tasks.classification.keras_hub_model import TimmNetwork

    network = TimmNetwork(num_classes=num_classes, image_size=image_size, name=NAME)
    trained = TaskModel(network, [1], batch=1)  # what a hydrali Keras checkpoint holds: the network, wrapped
    trained(np.zeros((1, image_size, image_size, 3), "float32"))
    trained.load_weights(sorted((run_dir / "checkpoints").glob("epoch*.weights.h5"))[-1])
    return network


def _keras_backbone_weights(run: dict, path) -> str:
    """The backbone of a hydrali Keras run's last checkpoint, saved by Keras as a .weights.h5 file."""
    _keras_network_of_checkpoint(run["dir"], num_classes=5, image_size=32).layers[1].save_weights(path)
    return str(path)


# The claim is measured over seeds and CPU kernels, not on one draw: weights pretrained at batch 16 (digits 0-4: best
# val/acc 0.93-0.99 by their third epoch) against random ones, after one epoch on digits 5-9, when the head start
# shows (by the second both reach about 0.95). Keras on an Intel Xeon with AVX-512 and AMX, seeds 0, 1, 2, its
# margin (fine-tuned minus scratch): 0.11, 0.45, 0.28 with oneDNN's kernels as hydrali sets them; 0.52, 0.41, 0.34 with
# TensorFlow's own (TF_ENABLE_ONEDNN_OPTS=0); 0.40, 0.06, 0.15 with oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2). One
# draw can fall near 0 (one of 1 epoch at batch 64 did, -0.09, on an AMD EPYC with AVX-512, issue 47): the test takes
# the mean over SEEDS, whose smallest measured mean margin was 0.23, against MARGIN. Lightning, seeds 0, 1: 0.46, 0.26.
SEEDS = (0, 1)
MARGIN = 0.1
TRANSFER = ["data.batch_size=16"]  # 45 steps an epoch on digits 0-4 (11 at batch 64: too few for the head start)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])  # keras: trains
# in this process
def test_weights_trained_on_digits_0_to_4_train_digits_5_to_9_better_than_random_ones(
    tmp_path, data_dir, backend, monkeypatch
):
    from hydrali.tasks.classification.datasets import write_digits

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no hub: the weights are files
    digits = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    first = digits_classes(digits, tmp_path / "digits0-4", list("01234"))
    second = digits_classes(digits, tmp_path / "digits5-9", list("56789"))
    margins = []
    for seed in SEEDS:
        runs = tmp_path / f"seed{seed}"
        runs.mkdir()
        source = _train(runs, data_dir, backend, first, "pretrain", "epochs=3", f"seed={seed}", *TRANSFER)
        if backend == "lightning":  # timm's own layout: config.json and model.safetensors
            network = timm_network_of_checkpoint(source["dir"] / "checkpoints" / "last.ckpt", NAME, num_classes=5)
            weights = str(
                write_timm_weights(
                    network, runs / "digits-weights", 32, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], 0.875
                )
            )
        else:  # Keras' own format: the backbone's .weights.h5
            weights = _keras_backbone_weights(source, runs / "digits-backbone.weights.h5")
        one_epoch = ("epochs=1", f"seed={seed}", *TRANSFER)
        scratch = _train(runs, data_dir, backend, second, "scratch", *one_epoch)
        tuned = _train(runs, data_dir, backend, second, "tuned", f"model.weights={weights}", *one_epoch)
        scratch_acc, tuned_acc = scratch["history"][-1]["val/acc"], tuned["history"][-1]["val/acc"]
        print(json.dumps({"backend": backend, "seed": seed, "scratch": scratch_acc, "fine-tuned": tuned_acc}))
        margins.append(tuned_acc - scratch_acc)
    assert np.mean(margins) > MARGIN, margins


@pytest.mark.slow
def test_weights_of_another_architecture_are_one_line_naming_model_weights(tmp_path):
    import timm
    from safetensors.torch import save_file

    other = tmp_path / "resnet34.safetensors"
    save_file(timm.create_model("resnet34", num_classes=10).state_dict(), str(other))
    run_dir = tmp_path / "run"
    out = run_cli("model=timm", f"model.weights={other}", "tracking=none", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    fails_with(out, f"model.weights={other}", "resnet18")
