"""Settings that follow the image size a run reads, chosen in a config by a generic rule (`hydrali_by_size`), so
that a model's YAML says what its network needs and core knows no network: e.g. conf/model/small_resnet.yaml's stem,
`${hydrali_by_size:${data.image_size},64,small,imagenet}` (one 3x3 conv up to 64 px; 7x7/2 and a max-pool above)."""

from __future__ import annotations

UNKNOWN_YET = "decided by the image size"  # the value while data.image_size is null (data=webdataset, before its
#   shards' size is read: hydrali.core.data.shards_image_size); nothing builds a network before that


def by_size(image_size: int | None, largest: int, up_to: str, above: str) -> str:
    """`up_to` for images of at most `largest` px (data.image_size), `above` for larger ones; UNKNOWN_YET while the
    size is not known."""
    if image_size is None:
        return UNKNOWN_YET
    return up_to if int(image_size) <= int(largest) else above
