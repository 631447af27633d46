"""The layout of the detection task's tensors, one name per fact: what the recipes emit, what the heads output, and
what the losses, the decoders and the evaluation read. Framework-free, so that every side imports it.

Per anchor (in the anchor order of anchors.py):

    targets [B, N, TARGET_COLUMNS]   the box's BOX_VALUES encoded offsets, then its label (a float) at LABEL_COLUMN
    raw     [B, N, BOX_VALUES + logits_per_anchor(K)]   the predicted offsets, then the class logits: background's
                                     at index BACKGROUND, object k's at index k

Labels: BACKGROUND for anchors matched to no object, FIRST_OBJECT_LABEL..K for the objects (DALI's `readers.coco`
numbers the annotation file's categories so, in the file's order); detections padded to a fixed count carry
labels below FIRST_OBJECT_LABEL in their padding rows.
"""

from __future__ import annotations

BOX_VALUES = 4  # numbers per box: a box's 4 encoded offsets (centre x, centre y, width, height) or its
# 4 coordinates (left, top, right, bottom)
LABEL_COLUMN = BOX_VALUES  # targets[..., LABEL_COLUMN]: the anchor's label, after its box's offsets
TARGET_COLUMNS = BOX_VALUES + 1
TARGET_COLUMN_AXIS = 1  # one image's targets are [N, TARGET_COLUMNS]: its columns run along this axis
IMAGE_ID_COLUMNS = 1  # a validation image's id: [IMAGE_ID_COLUMNS] int32, the annotation file's image id

BACKGROUND = 0  # the label of anchors matched to no object, and the index of its logit
FIRST_OBJECT_LABEL = BACKGROUND + 1  # objects are labelled FIRST_OBJECT_LABEL..K; the logits hold background first

TRAINING_OUTPUTS = ("images", "targets")  # what a recipe returns in training, in order
VALIDATION_OUTPUTS = (*TRAINING_OUTPUTS, "image_ids")  # ... and in validation
IMAGE_IDS_OUTPUT = VALIDATION_OUTPUTS.index("image_ids")  # the image ids' place in a validation batch


def logits_per_anchor(num_classes: int) -> int:
    """The class logits a head emits per anchor for `num_classes` object classes: background's, then each class's."""
    return FIRST_OBJECT_LABEL + num_classes
