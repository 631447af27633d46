"""The Keras 3 backend (TensorFlow, tf.distribute.MirroredStrategy), fed by DALI's TensorFlow plugin.

Importing this package loads nothing of TensorFlow (its spec is read by `hydrali --help`); it sets the environment
TensorFlow reads at its import (each variable only where the caller has not set it), and backend.py imports
TensorFlow first, without its start-up chatter.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ notices (errors still print)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# TensorFlow's oneDNN kernels on the CPU: TensorFlow turns them on by itself only on CPUs with AVX-512 VNNI, BF16 or
# AMX; elsewhere (an AMD EPYC with AVX2 here, as on CI) its own kernels trained ResNet-18 at 32 px 5x slower (2.28 s
# against 0.44 s a step of 64 images on one thread; torch: 0.58 s). Results may differ from its own kernels by
# floating-point round-off. TF_ENABLE_ONEDNN_OPTS=0 in the environment turns them off (TensorFlow's own switch).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
