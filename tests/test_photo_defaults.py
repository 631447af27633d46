"""A user's first run on a photo folder (data=imagefolder, 224 px) trains ResNet-18-D, timm's resnet18d layout, on
both backends (conf/model/sized_resnet.yaml decides by the image size), for the epochs and with the flip averaging
that photos take (conf/data/imagefolder.yaml, conf/task/classification.yaml); the bundled digits keep their small
CNN, 10 epochs and no flips."""

from __future__ import annotations

import h5py
import pytest
import torch

from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, compose_config
from tests.support.datasets import write_one_image_per_class

QUIET = {"lightning": LIGHTNING_QUIET, "keras": KERAS_QUIET}


def _kernel_shapes(run_dir, backend: str) -> list[tuple[int, ...]]:
    """The shapes of every convolution kernel in the run's checkpoint, as torch orders them (out, in, h, w), sorted."""
    if backend == "lightning":
        state = torch.load(run_dir / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
        return sorted(tuple(v.shape) for k, v in state.items() if v.ndim == 4 and not k.startswith("ema"))
    found = []
    with h5py.File(next((run_dir / "checkpoints").glob("*.weights.h5"))) as weights:
        weights.visititems(
            lambda name, v: (
                found.append((v.shape[3], v.shape[2], v.shape[0], v.shape[1]))
                if isinstance(v, h5py.Dataset) and v.ndim == 4 and not name.startswith("optimizer")
                else None
            )
        )  # h, w, in, out; the optimizer's slots of the same shapes left out
    return sorted(found)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])  # in this process
def test_a_photo_folder_at_224_px_trains_timms_resnet18d_layout(tmp_path, backend):
    import timm

    from hydrali.core.run.runner import run

    write_one_image_per_class(tmp_path / "photos", 4, size=224)
    run_dir = tmp_path / "run"
    overrides = [f"backend={backend}", "data=imagefolder", f"data.root={tmp_path / 'photos'}", "data.batch_size=4"]
    run(
        compose_config([*overrides, "epochs=1", "tracking=none", *QUIET[backend]], tmp_path, tmp_path / "data", run_dir)
    )
    reference = timm.create_model("resnet18d", num_classes=4)
    expected = sorted(tuple(p.shape) for p in reference.state_dict().values() if p.ndim == 4)
    assert _kernel_shapes(run_dir, backend) == expected, "the deep 3x3 stem and ResNet-18's stages, as timm's resnet18d"


def test_the_defaults_compose_as_documented_for_a_photo_folder_and_for_the_digits(tmp_path):
    digits = compose_config([], tmp_path, tmp_path / "data")
    assert (digits.model.stem, list(digits.model.layers), list(digits.model.widths)) == (
        "small",
        [1, 1, 1],
        [32, 64, 128],
    )
    assert (digits.epochs, digits.task.flip_averaging, digits.model.shortcut) == (10, False, "conv")
    photos = compose_config(["data=imagefolder", "data.root=/photos"], tmp_path, tmp_path / "data")
    assert (photos.data.image_size, photos.pipeline.name, photos.epochs) == (224, "standard", 20)
    assert (photos.model.stem, photos.model.shortcut) == ("deep", "avgpool")
    assert (list(photos.model.layers), list(photos.model.widths)) == ([2, 2, 2, 2], [64, 128, 256, 512])
    assert photos.task.flip_averaging is True and photos.task.label_smoothing == 0.0
    optim = photos.optim
    assert (optim.name, optim.lr, optim.ref_batch, optim.schedule, optim.warmup_epochs) == ("sgd", 0.1, 32, "cosine", 1)
    assert photos.data.batch_size == 64
    # the user's own settings win over each default
    mine = ["data=imagefolder", "data.root=/p", "epochs=3", "task.flip_averaging=false", "model.stem=imagenet"]
    chosen = compose_config(mine, tmp_path, tmp_path / "data")
    assert (chosen.epochs, chosen.task.flip_averaging, chosen.model.stem) == (3, False, "imagenet")
    unflipped = compose_config(
        ["data=imagefolder", "data.root=/p", "pipeline.options.flip_probability=0"], tmp_path, tmp_path / "data"
    )
    assert unflipped.task.flip_averaging is False, "no mirrors in training, none in validation"
    small = compose_config(["data=imagefolder", "data.root=/photos", "data.image_size=64"], tmp_path, tmp_path / "d")
    assert (small.model.stem, list(small.model.layers)) == ("small", [1, 1, 1])
    assert compose_config(["experiment=cifar10"], tmp_path, tmp_path / "d").epochs == 24, "a recipe's epochs win"
