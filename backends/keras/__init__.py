"""The Keras 3 backend (TensorFlow, tf.distribute.MirroredStrategy), fed by DALI's TensorFlow plugin.

Importing this package loads nothing of TensorFlow (its spec is read by `hydrali --help`); backend.py imports
TensorFlow first, without its start-up chatter.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ notices (errors still print)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
