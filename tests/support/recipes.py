"""A user's own classification recipe, as a user writes one (pipeline.recipe=tests.support.recipes.decode_resize):
the arguments every recipe gets and its own options, nothing hydrali added since (no num_classes)."""

from __future__ import annotations

import nvidia.dali.fn as fn
import nvidia.dali.types as types
from nvidia.dali import pipeline_def


@pipeline_def
def decode_resize(
    source, device, layout, image_size, dtype, hw_decoder_load, *, mean, std, initial_fill, flip_probability
):
    """Decode on the CPU, resize to image_size, normalize (flip_probability is light's option, unused here)."""
    jpegs, labels = fn.readers.file(file_root=source.root, initial_fill=initial_fill, **source.reader_args())
    images = fn.resize(fn.decoders.image(jpegs, output_type=types.RGB), resize_x=image_size, resize_y=image_size)
    images = fn.crop_mirror_normalize(
        images, dtype=types.FLOAT, output_layout=layout, mean=[m * 255 for m in mean], std=[s * 255 for s in std]
    )
    return images, labels
