"""data.image_size for WebDataset shards: the size their data was converted at, unless the config sets one.

`hydrali convert` records the converted data config's data.image_size in manifest.json (made_by.image_size): the
bundled digits are 32 px photos, and a run from their shards trains them at 32 px, as a run from the digits does,
instead of data=webdataset's own default (224 px: 25 s an epoch instead of 4 s, silently). data=webdataset leaves
data.image_size null for this; a number on the command line (or in an experiment) is taken as it is. Resolved before
anything reads the config, so that a run dir records the number."""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from hydrali.core.data import webdataset
from hydrali.core.errors import HydraliError

log = logging.getLogger("hydrali")


def apply(cfg: DictConfig) -> int | None:
    """Set data.image_size from the shards' manifest where the config leaves it null; return what was set (None:
    the config's own number stands)."""
    if OmegaConf.select(cfg, "data.image_size") is not None:
        return None
    if str(cfg.data.get("name")) != webdataset.FORMAT:
        raise HydraliError(
            f"data.image_size=null: only data={webdataset.FORMAT} takes its image size from its shards: pass a number"
        )
    root = str(cfg.data.root)
    size = webdataset.read_manifest(root).made_by.get("image_size")
    if size is None:
        raise HydraliError(
            f"data.root={root}: its {webdataset.MANIFEST} does not say the image size its data was converted at "
            f"(written by an earlier hydrali convert): pass data.image_size"
        )
    cfg.data.image_size = int(size)
    log.info("data.image_size=%d: the size the shards' data was converted at (%s)", int(size), webdataset.MANIFEST)
    return int(size)
