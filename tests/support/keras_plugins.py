"""Keras sides of the tasks that record what they saw, plugged into hydrali as a user would (`task.sides.keras=...`).

`recording_classification` is the classification task's Keras side whose training loss also appends the labels
of each training batch to the file named by $HYDRALI_TEST_LABELS (one line per batch, as tf.print writes them),
after a first line with the seed this process trains with (Python's hash seed, which hydrali sets from it).

`recording_detection` is the detection task's Keras side whose validation also appends each detection this
process adds (a COCO result dict, one JSON line each) to the file named by $HYDRALI_TEST_DETECTIONS.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import tensorflow as tf

from hydrali.tasks.classification.keras_task import CrossEntropy, KerasClassification
from hydrali.tasks.detection.keras_task import KerasDetection
from hydrali.tasks.detection.validation import DetectionValidation

RECORD_ENV = "HYDRALI_TEST_LABELS"
DETECTIONS_ENV = "HYDRALI_TEST_DETECTIONS"


class LabelRecordingLoss(CrossEntropy):
    """Cross-entropy that appends each training batch's labels to `path` (validation calls `call` directly)."""

    def __init__(self, path: str, label_smoothing: float = 0.0, **kwargs):
        super().__init__(label_smoothing, **kwargs)
        self.path = path

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is None:  # training: Keras gives no sample weights (validation weighs out the padding)
            tf.print(tf.reshape(y_true, [-1]), output_stream=f"file://{self.path}", summarize=-1)
        return super().__call__(y_true, y_pred, sample_weight)


class RecordingClassification(KerasClassification):
    """The classification task's Keras side, with the label-recording loss."""

    def __init__(self, task, path: str):
        super().__init__(task)
        self.path = path
        with open(path, "a") as fh:
            fh.write(f"seed {os.environ.get('PYTHONHASHSEED')}\n")

    def loss(self):
        """The task's cross-entropy, recording the training labels."""
        return LabelRecordingLoss(self.path, self.task.label_smoothing)


def recording_classification(task, dataset) -> RecordingClassification:
    """A task.sides.keras: the classification task's Keras side recording into $HYDRALI_TEST_LABELS."""
    return RecordingClassification(task, os.environ[RECORD_ENV])


def read_record(path) -> tuple[str, list[list[int]]]:
    """The seed line's value and the labels of each training batch, from a file the loss wrote."""
    lines = Path(path).read_text().splitlines()
    seed = lines[0].split()[1]
    return seed, [[int(n) for n in re.findall(r"-?\d+", line)] for line in lines[1:] if line.strip()]


class RecordingValidation(DetectionValidation):
    """The detection validation, appending the detections that each batch adds to `path` (JSON lines)."""

    def __init__(self, *args, path: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.path = path

    def add_batch(self, *args, **kwargs) -> None:
        """Add the batch as the validation does; record the COCO result dicts it added."""
        before = len(self.collected()[0])
        super().add_batch(*args, **kwargs)
        with open(self.path, "a") as fh:
            fh.writelines(json.dumps(detection) + "\n" for detection in self.collected()[0][before:])


def recording_detection(task, dataset) -> KerasDetection:
    """A task.sides.keras: the detection task's Keras side recording its detections into $HYDRALI_TEST_DETECTIONS."""
    side = KerasDetection(task, dataset)
    side.validation = RecordingValidation(
        dataset.val, pictures=task.pictures, pictures_dir=Path(task.pictures_dir), path=os.environ[DETECTIONS_ENV]
    )
    return side


def read_detections(path) -> list[dict]:
    """The COCO result dicts a recording validation wrote, in order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
