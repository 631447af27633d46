"""Files that other processes may read while they are written."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomically(path: Path, content: bytes) -> Path:
    """Write `content` to `path` through a temporary file beside it and a rename: a reader finds the previous file or
    this one, whole, never one being written; a failed write (a full disk, an interrupt) leaves no temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_bytes(content)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
