"""Pretrained weights as the model libraries write them, made locally (these machines have no network): timm's hub
layout (config.json and model.safetensors, by timm.models.save_for_hf), a Hugging Face cache holding it, and
digits split into two sets of classes for fine-tuning from one to the other."""

from __future__ import annotations

import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the cache's snapshot name (a hub commit hash)


def write_timm_weights(network, folder: Path, image_size: int, mean, std, crop_fraction: float) -> Path:
    """`network` (a timm model) saved by timm in its hub layout in `folder`, its pretrained_cfg saying that it takes
    image_size x image_size images normalized by mean and std, centre-cropped at crop_fraction; returns `folder`."""
    from timm.models import save_for_hf

    network.pretrained_cfg = {
        **network.pretrained_cfg,
        "input_size": (3, image_size, image_size),
        "mean": tuple(mean),
        "std": tuple(std),
        "crop_pct": crop_fraction,
    }
    save_for_hf(network, folder, safe_serialization=True)
    return folder


def put_in_hub_cache(folder: Path, cache: Path, repo: str) -> Path:
    """The files of `folder` as the Hugging Face cache `cache` holds a download of hub repository `repo`."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, entry / "snapshots" / COMMIT)
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(COMMIT)
    return cache


def digits_classes(digits: Path, root: Path, classes: list[str]) -> Path:
    """An image folder at `root` holding only `classes` of the digits (train/ and val/)."""
    for split in ("train", "val"):
        for name in classes:
            shutil.copytree(digits / split / name, root / split / name)
    return root


def timm_network_of_checkpoint(checkpoint: Path, name: str, num_classes: int):
    """timm's network `name` holding the network weights of a hydrali Lightning checkpoint."""
    import timm
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    prefix = "torch_task.model."
    network = timm.create_model(name, num_classes=num_classes)
    network.load_state_dict({key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)})
    return network
