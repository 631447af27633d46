"""The Keras 3 backend (TensorFlow, tf.distribute.MirroredStrategy), fed by DALI's TensorFlow plugin."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ notices (errors still print)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from hydrali.backends.keras.quiet_start import import_tensorflow  # noqa: E402

import_tensorflow()   # first, so that no other import starts TensorFlow with its chatter
