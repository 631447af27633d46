"""task=brightness's DALI recipe (pipeline.recipe): framework-neutral, fed by core's Source, device and layout."""

from __future__ import annotations

from nvidia.dali import fn, pipeline_def, types


@pipeline_def
def brightness(source, device, layout, image_size, dtype, hw_decoder_load, *, initial_fill: int):
    """Read the shard's PNG files, decode, resize to image_size, scale to [0, 1]; (images, labels)."""
    files, labels = fn.readers.file(file_root=source.root, initial_fill=initial_fill, **source.reader_args())
    decoder = {"device": "mixed", "hw_decoder_load": hw_decoder_load} if device == "gpu" else {"device": "cpu"}
    images = fn.decoders.image(files, output_type=types.RGB, **decoder)
    images = fn.resize(images, resize_x=image_size, resize_y=image_size)
    kind = types.FLOAT16 if dtype == "float16" else types.FLOAT
    images = fn.crop_mirror_normalize(images, dtype=kind, output_layout=layout, mean=0.0, std=255.0)
    return images, labels.gpu() if device == "gpu" else labels
