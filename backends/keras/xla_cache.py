"""XLA's compiled steps kept between runs (backend.xla_cache): TensorFlow's persistent XLA cache, which a later run of
the same network, batch and precision on the same kind of device reads instead of compiling again.

TensorFlow reads every entry it finds, and one it cannot read (a run killed while writing it) fails the step that
needed it: measured on TensorFlow 2.21, Keras then ends the epoch as if the data had run out, without an error. So
TensorFlow never writes into the kept folder. It works in a folder of this process's own, filled from the kept one
before training; the entries it wrote there join the kept folder, each copied aside and renamed, once a fit has
ended (its every compile finished writing). TensorFlow reads its flags once per process (TF_XLA_FLAGS, at the first
compile, or sooner): the process's folder is named before TensorFlow is imported and serves every run of the
process.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from hydrali.backends.keras.quiet_start import stderr_captured
from hydrali.core.files import write_atomically

log = logging.getLogger("hydrali")

FLAG = "--tf_xla_persistent_cache_directory"
ENTRY_PATTERN = "xla_compile_cache__*.pb"  # the files TensorFlow writes, one per compiled cluster
# what TensorFlow prints for every entry it reads: it tries the text format before the binary one it wrote
READ_NOTICE = "Error parsing text-format tensorflow.XlaSerializedCacheEntry"
_process_folder: Path | None = None  # the folder TF_XLA_FLAGS names for this process, once set
OWNER_VARIABLE = "HYDRALI_XLA_PROCESS_FOLDER"  # the folder hydrali put in TF_XLA_FLAGS (children inherit both)


def device_label(gpus: list, tf_version: str) -> str:
    """A folder name for the compiled code's target: TensorFlow's version and the GPU's name and compute capability
    (a cached executable runs only where it was built), or the CPU."""
    if not gpus:
        return _safe(f"tf{tf_version}-cpu")
    import tensorflow as tf

    details = tf.config.experimental.get_device_details(gpus[0])
    capability = "".join(str(n) for n in details.get("compute_capability", ()))
    return _safe(f"tf{tf_version}-{details.get('device_name', 'gpu')}-sm{capability}")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


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
    folder = Path(tempfile.mkdtemp(prefix="hydrali-xla-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["TF_XLA_FLAGS"] = f"{flags} {FLAG}={folder}".strip()
    os.environ[OWNER_VARIABLE] = str(folder)
    _process_folder = folder
    return folder


def first_steps_quiet():
    """A Keras callback that holds back what is written to stderr during the first training batch and the first
    validation batch (where TensorFlow compiles, and reads kept entries), then passes it on without TensorFlow's
    notice for each entry read, counting those notices (`entries_read`). Defined on call: this module is imported
    before TensorFlow."""
    import keras

    class FirstStepsQuiet(keras.callbacks.Callback):
        """The callback first_steps_quiet describes."""

        def __init__(self):
            super().__init__()
            self.entries_read = 0
            self._open = ExitStack()
            self._captured = None
            self._trained_once = self._validated_once = False

        def _start(self) -> None:
            if self._captured is None:
                self._captured = self._open.enter_context(stderr_captured())

        def stop(self) -> None:
            """Pass on what was held back (every line but the notices); a no-op when nothing is."""
            if self._captured is not None:
                captured, self._captured = self._captured, None
                self._open.close()
                self.entries_read += sum(READ_NOTICE in line for line in captured.lines)
                kept = "".join(line for line in captured.lines if READ_NOTICE not in line)
                if kept:
                    os.write(2, kept.encode())

        def on_train_batch_begin(self, batch, logs=None):
            if not self._trained_once:
                self._start()

        def on_train_batch_end(self, batch, logs=None):
            if not self._trained_once:
                self._trained_once = True
                self.stop()

        def on_test_batch_begin(self, batch, logs=None):
            if not self._validated_once:
                self._start()

        def on_test_batch_end(self, batch, logs=None):
            if not self._validated_once:
                self._validated_once = True
                self.stop()

    return FirstStepsQuiet()


@contextmanager
def kept_compiles(cache_folder: str | None, label: str, *, publishes: bool) -> Iterator[list]:
    """Train inside this, with the callbacks it gives, to read XLA's compiled steps kept under
    `cache_folder`/xla/`label` and, when `publishes` (one writer per job) and the body ends without an error, keep
    the ones compiled now. None: nothing kept, no callbacks."""
    if cache_folder is None:
        yield []
        return
    process_folder = name_process_folder()
    if process_folder is None:
        log.info("backend.xla_cache: TF_XLA_FLAGS names a persistent cache already; that one is used")
        yield []
        return
    kept = Path(cache_folder) / "xla" / label
    try:
        found = sorted(kept.glob(ENTRY_PATTERN))
        for entry in found:
            if not (process_folder / entry.name).exists():
                shutil.copyfile(entry, process_folder / entry.name)
    except OSError as err:
        log.warning("backend.xla_cache: cannot read %s (%s); compiling as if it were empty", kept, err)
        found = []
    quiet = first_steps_quiet()
    try:
        yield [quiet]
    finally:
        quiet.stop()  # an error inside the first step: what it wrote is not lost
    if found:
        log.info(
            "backend.xla_cache: TensorFlow read %d of the %d compiled step(s) kept by earlier runs in %s",
            quiet.entries_read,
            len(found),
            kept,
        )
    if publishes:
        _publish(process_folder, kept)


def _publish(process_folder: Path, kept: Path) -> None:
    """Copy the entries TensorFlow wrote in `process_folder` that `kept` lacks into it, each under a temporary name
    then renamed (a reader never sees half an entry)."""
    new = [e for e in sorted(process_folder.glob(ENTRY_PATTERN)) if not (kept / e.name).exists()]
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
