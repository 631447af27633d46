"""Settings that follow the image size a run reads, chosen in a config by a generic rule (`hydrali_by_size`), so
that a model's YAML says what its network needs and core knows no network: e.g. conf/model/small_resnet.yaml's stem,
`${hydrali_by_size:${data.image_size},64,small,imagenet}` (one 3x3 conv up to 64 px; 7x7/2 and a max-pool above),
or conf/model/sized_resnet.yaml's whole network."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

UNKNOWN_YET = "decided by the image size"  # the value while data.image_size is null (data=webdataset, before its
#   shards' size is read: hydrali.core.data.shards_image_size); nothing builds a network before that


def by_size(image_size: int | None, largest: int, up_to: Any, above: Any) -> Any:
    """`up_to` for images of at most `largest` px (data.image_size), `above` for larger ones (a value or a list, e.g.
    conf/model/sized_resnet.yaml's layers); UNKNOWN_YET while the size is not known."""
    if image_size is None:
        return UNKNOWN_YET
    chosen = up_to if int(image_size) <= int(largest) else above
    # a list as a ListConfig: OmegaConf.resolve (`hydrali --cfg job --resolve`) cannot put a plain list in its node
    return OmegaConf.create(chosen) if isinstance(chosen, (list, dict)) else chosen
