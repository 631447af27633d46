"""Progressive resizing on torch (hydrali.core.policies.resizing): a training batch's images scaled to its epoch's
size."""

from __future__ import annotations

import functools

import torch

from hydrali.core.policies.resizing import resampling_matrix


@functools.lru_cache(maxsize=16)
def _matrix(source: int, side: int, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(resampling_matrix(source, side)).to(device)


def scaled(images: torch.Tensor, side: int) -> torch.Tensor:
    """NCHW `images` scaled to side x side by core's resampling matrices (bilinear with antialiasing), in float32 also
    under mixed precision (as on Keras), returned in their own dtype."""
    rows = _matrix(images.shape[-2], side, images.device)
    columns = rows if images.shape[-1] == images.shape[-2] else _matrix(images.shape[-1], side, images.device)
    with torch.autocast(images.device.type, enabled=False):  # Lightning's training step runs under autocast
        return torch.einsum("ih,nchw,jw->ncij", rows, images.float(), columns).to(images.dtype)
