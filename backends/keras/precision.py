"""backend.precision on Keras: the dtype policy layers are built under (16-mixed scales the loss)."""

from __future__ import annotations

import contextlib

import keras

from hydrali.core.config.schema import Precision

POLICIES = {
    Precision["32-true"]: "float32",
    Precision["bf16-mixed"]: "mixed_bfloat16",
    Precision["16-mixed"]: "mixed_float16",
}  # backend.precision -> the Keras dtype policy


@contextlib.contextmanager
def dtype_policy(precision: str):
    """Build layers under the Keras dtype policy of backend.precision, restoring the previous policy after."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(POLICIES[Precision.of(precision, "backend.precision")])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
