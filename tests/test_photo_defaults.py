"""A user's first run on a photo folder (data=imagefolder, 224 px) trains a network that brings the photos down 4x
before its first stage, on both backends (conf/model/small_resnet.yaml decides by the image size); the bundled
digits keep their 3x3 stem."""

from __future__ import annotations

import h5py
import pytest
import torch

from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, compose_config
from tests.support.datasets import write_one_image_per_class

QUIET = {"lightning": LIGHTNING_QUIET, "keras": KERAS_QUIET}


def _first_kernels(run_dir, backend: str) -> set[tuple[int, ...]]:
    """The shapes of the convolution kernels (kernel height, width) with 3 input channels in the run's checkpoint."""
    if backend == "lightning":
        state = torch.load(run_dir / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
        return {tuple(v.shape[2:]) for v in state.values() if v.ndim == 4 and v.shape[1] == 3}  # out, in, h, w
    found = set()
    with h5py.File(next((run_dir / "checkpoints").glob("*.weights.h5"))) as weights:
        weights.visititems(
            lambda _, v: (
                found.add(tuple(v.shape[:2]))
                if isinstance(v, h5py.Dataset) and v.ndim == 4 and v.shape[2] == 3
                else None
            )
        )  # h, w, in, out
    return found


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])  # in this process
def test_a_photo_folder_at_224_px_trains_a_network_with_a_downsampling_stem(tmp_path, backend):
    from hydrali.core.run.runner import run

    write_one_image_per_class(tmp_path / "photos", 4, size=224)
    run_dir = tmp_path / "run"
    overrides = [f"backend={backend}", "data=imagefolder", f"data.root={tmp_path / 'photos'}", "data.batch_size=4"]
    run(
        compose_config([*overrides, "epochs=1", "tracking=none", *QUIET[backend]], tmp_path, tmp_path / "data", run_dir)
    )
    assert _first_kernels(run_dir, backend) == {(7, 7)}, "7x7/2 and a max-pool, not a 3x3 at full resolution"


def test_the_bundled_digits_keep_their_small_stem(tmp_path):
    assert compose_config([], tmp_path, tmp_path / "data").model.stem == "small"
    photos = compose_config(["data=imagefolder", "data.root=/photos"], tmp_path, tmp_path / "data")
    assert photos.model.stem == "imagenet" and photos.model.widths == [32, 64, 128]
    small = compose_config(["data=imagefolder", "data.root=/photos", "data.image_size=64"], tmp_path, tmp_path / "d")
    assert small.model.stem == "small"
