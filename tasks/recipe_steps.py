"""DALI steps that both tasks' recipes (tasks/*/recipes.py) take: decoding, normalizing, moving an output to the
recipe's device. They know nothing of torch or TensorFlow."""

from __future__ import annotations

import nvidia.dali.fn as fn
import nvidia.dali.types as types

from hydrali.core.data.pipelines import decoder_args

DTYPES = {"float": types.FLOAT, "float16": types.FLOAT16}  # pipeline.dtype -> the DALI type of a recipe's images
PIXEL_RANGE = 255  # decoded pixels are 0..255; mean and std are given for pixels in [0, 1]


def decode(jpegs, device: str, hw_decoder_load: float):
    """RGB images decoded from `jpegs`: by the mixed decoder on the GPU (this share on its hardware decoder), else
    on the CPU."""
    return fn.decoders.image(jpegs, output_type=types.RGB, **decoder_args(device, hw_decoder_load))


def normalize(images, image_size: int, layout: str, mean, std, dtype: str, mirror=None, crop_pos=None):
    """The image_size x image_size window (centred, or at crop_pos: (y, x) in [0, 1] of the room left) of
    `images`, mirrored where `mirror` says, normalized by `mean` and `std`, as `dtype`, in `layout`."""
    flip = {} if mirror is None else {"mirror": mirror}
    window = {} if crop_pos is None else {"crop_pos_y": crop_pos[0], "crop_pos_x": crop_pos[1]}
    return fn.crop_mirror_normalize(
        images,
        dtype=DTYPES[dtype],
        output_layout=layout,
        crop=(image_size, image_size),
        mean=[m * PIXEL_RANGE for m in mean],
        std=[s * PIXEL_RANGE for s in std],
        **flip,
        **window,
    )


def on_device(data, device: str):
    """A recipe's output `data` where the recipe runs: moved to the GPU for device="gpu"."""
    return data.gpu() if device == "gpu" else data
