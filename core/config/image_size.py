"""What the image size a run reads decides about its network, in one place for both backends: the stem of
conf/model/small_resnet.yaml (`stem: ${hydrali_stem:${data.image_size}}`). Images up to SMALL_IMAGES px (the bundled
digits' 32, CIFAR's 32, Tiny ImageNet's 64) keep their full resolution in the first stage (one 3x3 conv); larger
ones, a user's photos at imagefolder's 224, are brought down 4x first (7x7/2 conv and 3x3/2 max-pool, as the
ImageNet ResNets do), so that no stage runs at full photo resolution."""

from __future__ import annotations

SMALL_IMAGES = 64  # the largest image side (data.image_size) the small stem keeps at full resolution


UNKNOWN_YET = "decided by the image size"  # the stem while data.image_size is null (data=webdataset, before its
#   shards' size is read: hydrali.core.data.shards_image_size); nothing builds a network before that


def stem_for(image_size: int | None) -> str:
    """The ResNet stem suited to images of `image_size` px: small (3x3, stride 1) or imagenet (stride 4)."""
    if image_size is None:
        return UNKNOWN_YET
    return "small" if int(image_size) <= SMALL_IMAGES else "imagenet"
