"""XLA's compiled steps kept between runs (backend.xla_cache): TensorFlow's persistent XLA cache, which a later run of
the same compiled graph (network, batch, image size, precision, optimizer, loss) on the same kind of device reads
instead of compiling again.

An entry TensorFlow cannot read fails the step that needed it: measured on TensorFlow 2.21 with a truncated entry,
Keras then ends the epoch as if the data had run out, without an error. So TensorFlow never writes into the kept
folder, which several runs share: it works in a folder of this process's own, where the kept entries are linked
before training, and the entries it wrote there join the kept folder whole (copied aside, then renamed) when the fit
ends. TensorFlow reads its flags once per process (TF_XLA_FLAGS): the process's folder is named before TensorFlow is
imported and serves every run of the process.

TensorFlow prints "Error parsing text-format tensorflow.XlaSerializedCacheEntry" for each entry it reads (it tries
the text format before the binary one it wrote) and then reads it: the log says so before training (unless
TF_CPP_MIN_LOG_LEVEL=3, which tf2onnx's import sets, hides TensorFlow's error lines).

TensorFlow's key for an entry is a hash of the compiled function's signature and HLO, both of which carry the traced
function's name with a number the process counts up as it traces (measured on TensorFlow 2.21: one more tf.function
traced before fit gives other keys): a later run reads the entries of an earlier run that traced the same functions
in the same order, as the same command does.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hydrali.core.files import write_atomically

log = logging.getLogger("hydrali")

FLAG = "--tf_xla_persistent_cache_directory"
ENTRY_PATTERN = "xla_compile_cache__*.pb"  # the files TensorFlow writes, one per compiled cluster
READ_NOTICE = "Error parsing text-format tensorflow.XlaSerializedCacheEntry"  # TensorFlow's, per entry it reads
OWNER_VARIABLE = "HYDRALI_XLA_PROCESS_FOLDER"  # the folder hydrali put in TF_XLA_FLAGS (children inherit both)
_process_folder: Path | None = None  # the folder TF_XLA_FLAGS names for this process, once set


def device_label(gpus: list, tf_version: str) -> str:
    """A folder name for what the compiled code depends on beyond its graph: TensorFlow's version, the GPU's name and
    compute capability (or the CPU and its instruction sets), and the XLA flags in force (a short hash)."""
    import tensorflow as tf

    flags = " ".join(t for t in os.environ.get("TF_XLA_FLAGS", "").split() if not t.startswith(FLAG))
    settings = [flags, os.environ.get("XLA_FLAGS", "")]
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        capability = "".join(str(n) for n in details.get("compute_capability", ()))
        device = f"{details.get('device_name', 'gpu')}-sm{capability}"
    else:
        device = "cpu"
        settings.append(_cpu_features())
    digest = hashlib.sha256("\n".join(settings).encode()).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"tf{tf_version}-{device}-{digest}")


def _cpu_features() -> str:
    """The CPU's instruction sets as Linux lists them (XLA compiles CPU code for the machine's own); empty where
    /proc/cpuinfo cannot be read."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line for line in cpuinfo if line.startswith("flags")), "")
    except OSError:
        return ""


def name_process_folder() -> Path | None:
    """This process's folder for TensorFlow's cache, named in TF_XLA_FLAGS the first time (call it before TensorFlow
    reads its flags); None when the caller's TF_XLA_FLAGS names a persistent cache already (theirs is used). A folder
    that TF_XLA_FLAGS holds because a parent hydrali process named it there (the environment is inherited) is not
    the caller's: it is replaced by this process's own."""
    global _process_folder
    if _process_folder is not None:
        return _process_folder
    flags = os.environ.get("TF_XLA_FLAGS", "")
    inherited = os.environ.get(OWNER_VARIABLE, "")
    if inherited:
        flags = " ".join(token for token in flags.split() if token != f"{FLAG}={inherited}")
    if FLAG in flags:
        return None
    folder = Path(tempfile.mkdtemp(prefix=f"hydrali-xla-{os.getpid()}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["TF_XLA_FLAGS"] = f"{flags} {FLAG}={folder}".strip()
    os.environ[OWNER_VARIABLE] = str(folder)
    _process_folder = folder
    return folder


@contextmanager
def kept_compiles(cache_folder: str | None, label: str, *, publishes: bool) -> Iterator[None]:
    """Train inside this to read XLA's compiled steps kept under `cache_folder`/xla/`label` and, when `publishes`
    (one writer per job), to keep the ones compiled now when the body ends, also by an error or a preemption (the
    entries TensorFlow wrote are whole). None: nothing kept."""
    if cache_folder is None:
        yield
        return
    process_folder = name_process_folder()
    if process_folder is None:
        log.info("backend.xla_cache: TF_XLA_FLAGS names a persistent cache already; that one is used")
        yield
        return
    kept = Path(cache_folder) / "xla" / label
    try:
        found = sorted(kept.glob(ENTRY_PATTERN))
        for entry in found:
            link = process_folder / entry.name
            if not link.exists():
                link.symlink_to(entry.resolve())
    except OSError as err:
        log.warning("backend.xla_cache: cannot read %s (%s); compiling as if it were empty", kept, err)
        found = []
    if found:
        log.info(
            "backend.xla_cache: %d compiled step(s) kept by earlier runs in %s; TensorFlow prints %r for each one "
            "it reads (it tries the text format first), then reads it",
            len(found),
            kept,
            READ_NOTICE,
        )
    try:
        yield
    finally:
        if publishes:
            _publish(process_folder, kept)


def _publish(process_folder: Path, kept: Path) -> None:
    """Copy the entries TensorFlow wrote in `process_folder` that `kept` lacks into it, each under a temporary name
    then renamed (a reader never sees half an entry)."""
    new = [e for e in sorted(process_folder.glob(ENTRY_PATTERN)) if not e.is_symlink() and not (kept / e.name).exists()]
    if not new:
        return
    try:
        kept.mkdir(parents=True, exist_ok=True)
        for entry in new:
            write_atomically(kept / entry.name, entry.read_bytes())
    except OSError as err:
        log.warning(
            "backend.xla_cache: cannot keep the compiled steps in %s (%s): set it to a writable folder, or null",
            kept,
            err,
        )
        return
    log.info("backend.xla_cache: kept %d compiled step(s) for later runs in %s", len(new), kept)
