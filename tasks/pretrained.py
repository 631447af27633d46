"""Pretrained weights of timm's registry, as both frameworks read them (conf/model/timm.yaml): where a model's files
are found (the Hugging Face cache, or the hub when online) and the preprocessing its weights were trained with.
Framework-free: the torch side (timm) and the Keras side (keras-hub's converters of timm's files) read the same
files, found and explained here once."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig

from hydrali.core.errors import HydraliError, first_line

HUB_OWNER = "timm"  # timm's weights on the Hugging Face hub: huggingface.co/timm/<architecture>.<tag>
CONFIG_FILE = "config.json"  # timm's config of a hub model: architecture, num_classes, pretrained_cfg
WEIGHTS_FILE = "model.safetensors"  # its weights


def hub_repo(name: str) -> str:
    """The hub repository of timm model `name` (its architecture and pretrained tag, e.g. resnet18.a1_in1k); a
    one-line error when the tag is missing (the hub holds one repository per tag)."""
    if "." not in name:
        raise HydraliError(
            f"model.name={name} with model.pretrained=true: name the weights too, as timm's hub does "
            f"(<architecture>.<tag>, e.g. resnet18.a1_in1k; timm.list_pretrained('{name}*') lists them)"
        )
    return f"{HUB_OWNER}/{name}"


def hub_file(name: str, filename: str) -> Path:
    """The local path of `filename` of timm model `name`: from the Hugging Face cache, downloaded into it when the
    hub can be reached; a one-line error saying where to put the file when it cannot."""
    from huggingface_hub import constants, hf_hub_download

    repo = hub_repo(name)
    try:
        try:
            return Path(hf_hub_download(repo_id=repo, filename=filename, local_files_only=True))
        except Exception:  # not in the cache: from the hub, if its host is known (else at once, without retries)
            socket.getaddrinfo(urlparse(constants.ENDPOINT).hostname, 443)
            return Path(hf_hub_download(repo_id=repo, filename=filename))
    except Exception as err:  # offline mode, no network, no such repository or file: each says "not found" its way
        cache = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
        raise HydraliError(
            f"model.name={name}: its pretrained weights' {filename} is not in the Hugging Face cache ({cache}) and "
            f"the hub cannot give it ({type(err).__name__}): on a machine online run `hf download {repo} "
            f"--local-dir DIR`, copy DIR here and pass model.weights=DIR, or set HF_HUB_CACHE to a cache holding them"
        ) from err


def architecture_of(name: str) -> str:
    """The timm architecture of model `name` (without the weights' tag: resnet18 of resnet18.a1_in1k)."""
    return name.split(".", 1)[0]


def weights_config(model: DictConfig) -> Path | None:
    """timm's config file of the weights `model` starts from: beside model.weights (timm's hub layout), or of
    model.name on timm's hub (model.pretrained=true); None for random weights or a weights file alone."""
    if model.get("weights") is not None:
        path = Path(str(model.weights)).expanduser()
        if not path.exists():
            raise HydraliError(f"model.weights={model.weights}: no such file or directory")
        found = (path if path.is_dir() else path.parent) / CONFIG_FILE
        return found if found.is_file() else None
    return hub_file(str(model.name), CONFIG_FILE) if model.get("pretrained") else None


def weights_preprocessing(model: DictConfig) -> dict[str, Any] | None:
    """How the weights `model` starts from (conf/model/timm.yaml) expect their images: image_size, mean, std (in
    [0, 1]) and crop_fraction, from the pretrained_cfg of their timm config; None when there is no such config."""
    path = weights_config(model)
    if path is None:
        return None
    try:
        cfg = json.loads(path.read_text()).get("pretrained_cfg") or {}
    except (OSError, ValueError, AttributeError) as err:
        raise HydraliError(f"model.name={model.name}: {path} is not timm's JSON config ({first_line(err)})") from err
    found = {
        "image_size": int(cfg["input_size"][-1]) if "input_size" in cfg else None,
        "mean": [float(m) for m in cfg["mean"]] if "mean" in cfg else None,
        "std": [float(s) for s in cfg["std"]] if "std" in cfg else None,
        "crop_fraction": float(cfg["crop_pct"]) if "crop_pct" in cfg else None,
    }
    return {key: value for key, value in found.items() if value is not None}
