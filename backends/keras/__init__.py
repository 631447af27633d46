"""The Keras 3 backend (TensorFlow, tf.distribute.MirroredStrategy), fed by DALI's TensorFlow plugin.

Importing this package loads nothing of TensorFlow (its spec is read by `hydrali --help`, so every hydrali command
imports it before TensorFlow); it sets the environment TensorFlow reads at its import (ENVIRONMENT, each variable only
where the caller has not set it), and backend.py imports TensorFlow first, without its start-up chatter.
"""

import os
import sys
import warnings

ENVIRONMENT = {
    "TF_CPP_MIN_LOG_LEVEL": "2",  # TensorFlow's C++ notices (errors still print)
    "KERAS_BACKEND": "tensorflow",
    # TensorFlow's oneDNN kernels on the CPU: TensorFlow turns them on by itself only on CPUs with AVX-512 VNNI, BF16
    # or AMX; elsewhere (an AMD EPYC with AVX2 here, as on CI) its own kernels trained ResNet-18 at 32 px 5x slower
    # (2.28 s against 0.44 s a step of 64 images on one thread; torch: 0.58 s). Results may differ from its own
    # kernels by floating-point round-off. TF_ENABLE_ONEDNN_OPTS=0 in the environment turns them off (TensorFlow's
    # own switch).
    "TF_ENABLE_ONEDNN_OPTS": "1",
}
if "tensorflow" in sys.modules and "TF_ENABLE_ONEDNN_OPTS" not in os.environ:
    warnings.warn(
        "TensorFlow was imported before hydrali's Keras backend: it runs with its own choice of CPU kernels "
        "(import hydrali.backends.keras first, or set TF_ENABLE_ONEDNN_OPTS=1)",
        stacklevel=2,
    )
for _name, _value in ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)
