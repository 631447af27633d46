"""Progressive resizing on Keras (hydrali.core.run.resizing): a training batch's images scaled to its epoch's side,
and the callback that sets the side at each epoch's start."""

from __future__ import annotations

from typing import Callable

import keras
import tensorflow as tf

from hydrali.core.run.resizing import resampling_matrix


def scaled(images, side: int):
    """NHWC `images` scaled to side x side by core's resampling matrices (bilinear with antialiasing), in their own
    dtype; matrix products, which XLA compiles (TensorFlow's antialiased tf.image.resize is an op it cannot)."""
    rows = tf.constant(resampling_matrix(int(images.shape[1]), side))
    columns = tf.constant(resampling_matrix(int(images.shape[2]), side))
    return tf.cast(tf.einsum("ih,nhwc,jw->nijc", rows, tf.cast(images, "float32"), columns), images.dtype)


class TrainingSides(keras.callbacks.Callback):
    """Sets the model's `train_side` at each epoch's start to what `side_of(epoch)` says (None: the pipeline's
    side); Keras builds its train function again when the side changes (a side is a static shape: XLA compiles each
    side once)."""

    def __init__(self, side_of: Callable[[int], int | None]):
        super().__init__()
        self.side_of = side_of

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        side = self.side_of(epoch)
        if side != self.model.train_side:
            self.model.train_side = side
            self.model.make_train_function(force=True)
