"""A DALI failure at run time, told to the user in one line: which operator, DALI's own words, what to change.

Only a decoder's failure starts a search for the files that cannot be decoded (it stops at the
first few); any other failure (memory, a pipeline that cannot build, ...) is reported as it is,
with the setting most likely to fix it.
"""

from __future__ import annotations

import re
from typing import Callable

from hydrali.core.errors import HydraliError

_OPERATOR = re.compile(r"Error in \w+ operator `([^`]+)`")
_ENCOUNTERED = re.compile(r"encountered:\s*(.+?)(?:\nCurrent pipeline object|\Z)", re.S)
CPP_CONTEXT = "C++ context:"  # DALI's line naming its C++ source file and line (empty in some builds): not the user's
_HINTS = (
    ("out of memory", "GPU or host memory ran out: lower data.batch_size or pipeline.prefetch_queue_depth"),
    ("allocation failed", "memory ran out: lower data.batch_size or pipeline.prefetch_queue_depth"),
    ("cudaerrormemoryallocation", "GPU memory ran out: lower data.batch_size or pipeline.prefetch_queue_depth"),
    ("cuda", "a CUDA error: check the driver, or run DALI on the CPU with pipeline.device=cpu"),
)


def dali_operator(message: str) -> str | None:
    """The DALI operator a failure message names (e.g. nvidia.dali.fn.decoders.image), or None."""
    match = _OPERATOR.search(message)
    return match.group(1) if match else None


def dali_reason(message: str) -> str:
    """DALI's own description of the failure, on one line."""
    match = _ENCOUNTERED.search(message)
    text = (match.group(1) if match else message).split("Stacktrace (")[0]  # C++ frames follow
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("[frame")]
    lines = [
        line
        for line in lines
        if "pipeline object is no longer valid" not in line
        and not line.startswith(("Critical error in pipeline", CPP_CONTEXT))
    ]
    return re.sub(r"\[/[^\]]*\]\s*", "", " ".join(lines[:3]))[:400] or "unknown error"


def is_decode_failure(message: str) -> bool:
    """Whether a decoder failed on its input while running (and so, most likely, on a file): not while the
    pipeline was built, and not for lack of memory or a CUDA error."""
    operator = dali_operator(message) or ""
    lowered = message.lower()
    if "when building pipeline" in lowered or any(needle in lowered for needle, _ in _HINTS):
        return False
    return ".decoders." in operator


def explain_dali_error(err: Exception, find_bad_files: Callable[[], str | None]) -> HydraliError:
    """One clear error for a DALI failure; `find_bad_files()` names undecodable files (run for decode failures only)."""
    message = str(err)
    reason = dali_reason(message)
    operator = dali_operator(message)
    if is_decode_failure(message):
        named = find_bad_files()
        if named:
            return HydraliError(named)
        return HydraliError(
            f"DALI's {operator} failed ({reason}) but every file decodes with PIL: "
            f"try pipeline.device=cpu, or report the file set"
        )
    hint = next((text for needle, text in _HINTS if needle in message.lower()), None)
    where = f"DALI's {operator}" if operator else "DALI"
    return HydraliError(f"{where} failed: {reason}" + (f"; {hint}" if hint else ""))
