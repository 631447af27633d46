"""Progressive resizing on Keras (hydrali.core.policies.resizing): a training batch's images scaled to its epoch's size,
and the callback that sets the size at each epoch's start."""

from __future__ import annotations

from typing import Callable

import keras
import tensorflow as tf

from hydrali.core.policies.resizing import resampling_matrix


def scaled(images, side: int):
    """NHWC `images` scaled to side x side by core's resampling matrices (bilinear with antialiasing), in their own
    dtype; matrix products, which XLA compiles (TensorFlow's antialiased tf.image.resize is an op it cannot)."""
    rows = tf.constant(resampling_matrix(int(images.shape[1]), side))
    columns = tf.constant(resampling_matrix(int(images.shape[2]), side))
    return tf.cast(tf.einsum("ih,nhwc,jw->nijc", rows, tf.cast(images, "float32"), columns), images.dtype)


class TrainingSizes(keras.callbacks.Callback):
    """Sets the model's `train_size` at each epoch's start to what `size_of(epoch)` says (None: the pipeline's
    size); Keras builds its train function again when the size changes (a size is a static shape: XLA compiles each
    size once)."""

    def __init__(self, size_of: Callable[[int], int | None]):
        super().__init__()
        self.size_of = size_of

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        size = self.size_of(epoch)
        if size != self.model.train_size:
            self.model.train_size = size
            self.model.make_train_function(force=True)
