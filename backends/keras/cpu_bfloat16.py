"""Whether TensorFlow runs bfloat16 convolutions on this CPU, asked of TensorFlow itself before a run with
backend.precision=bf16-mixed trains on the CPU.

TensorFlow hands a bfloat16 convolution to oneDNN on CPUs with AVX-512 and oneDNN then needs bfloat16 kernels: with
ONEDNN_MAX_CPU_ISA holding oneDNN to AVX2 (or older) on such a CPU, the first convolution fails in oneDNN's words
("could not create a primitive descriptor") after the run dir and its MLflow run were written. Measured on a 2-core
Xeon with AVX-512 and AMX (TF_ENABLE_ONEDNN_OPTS=1): ONEDNN_MAX_CPU_ISA=SSE41, AVX, AVX2, AVX2_VNNI, AVX2_VNNI_2 fail;
AVX512_CORE and later, ALL, and TF_ENABLE_ONEDNN_OPTS=0 (TensorFlow's own kernels) run. The question is put to a
process of its own (about 4 s, only for this precision on the CPU): an operation in the run's process would start
TensorFlow's runtime before the run splits the CPU into its replicas' logical devices."""

from __future__ import annotations

import os
import subprocess
import sys

from hydrali.core.errors import HydraliError

ONE_CONVOLUTION = (
    "import tensorflow as tf\n"
    "images = tf.zeros((1, 4, 4, 1), tf.bfloat16)\n"
    "tf.nn.conv2d(images, tf.zeros((3, 3, 1, 1), tf.bfloat16), 1, 'SAME').numpy()\n"
)
KERNEL_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "TF_ENABLE_ONEDNN_OPTS")  # named in the refusal where set
PROBE_TIMEOUT_S = 300  # TensorFlow's import and one convolution: seconds, minutes on a loaded machine


_answered: set[str] = set()  # "yes" once TensorFlow ran one in this process's environment (asked once a process)


def check_bfloat16_convolution() -> None:
    """Return if TensorFlow, with this process's environment, runs a bfloat16 convolution on this CPU; otherwise a
    HydraliError naming the settings that would train."""
    if "yes" in _answered:
        return
    asked = subprocess.run(
        [sys.executable, "-c", ONE_CONVOLUTION],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
    )
    if asked.returncode == 0:
        _answered.add("yes")
        return
    if "primitive descriptor" not in asked.stderr:  # not oneDNN's answer: say what went wrong instead
        raise HydraliError(
            f"backend.precision=bf16-mixed: asking TensorFlow for a bfloat16 convolution on this CPU failed: "
            f"{(asked.stderr.strip().splitlines() or ['no output'])[-1]}"
        )
    kernels = ", ".join(f"{name}={os.environ[name]}" for name in KERNEL_VARIABLES if name in os.environ)
    raise HydraliError(
        f"backend.precision=bf16-mixed: TensorFlow cannot run a bfloat16 convolution on this CPU ({kernels}): "
        "use backend.precision=32-true, or let oneDNN use the CPU's bfloat16 kernels (unset ONEDNN_MAX_CPU_ISA), "
        "or use TensorFlow's own kernels (TF_ENABLE_ONEDNN_OPTS=0)"
    )
