"""Checks of image files before (and after) DALI reads them, shared by every task.

A file is judged by its content, not its name: a PNG saved as `.jpg` is a PNG, and DALI decodes it.
Two levels (`data.verify`): `quick` reads a few KiB of each file (its signature, and the end marker of
a JPEG or PNG), `full` also decodes each file: JPEG files with libjpeg-turbo (simplejpeg), whose
warnings count as errors, so that a JPEG damaged in its middle, which DALI decodes into wrong pixels
with at most an unnamed warning, is named; other formats with Pillow.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Callable, Iterable, Iterator

from hydrali.core.files import write_atomically

log = logging.getLogger("hydrali")

TAIL_BYTES = 4096  # an end marker may be followed by padding: look for it this far back
HEAD_BYTES = 16
READ_WORKERS = 8  # threads reading heads and tails (I/O bound)
CHUNK = 512  # files checked between two looks at how many bad ones were found


class Verify(str, Enum):
    """How much of every image file is checked before training (`data.verify`; its schema type)."""

    off = "off"  # nothing: a bad file surfaces as a decoder error while training (then it is named)
    quick = "quick"  # signature and end marker: a few KiB per file
    full = "full"  # quick, then a full decode of every file (libjpeg-turbo's warnings count as errors)

    def __str__(self) -> str:
        return self.value


class BadFiles(str, Enum):
    """What a run does with image files that fail the `data.verify` check (`data.bad_files`; its schema type)."""

    fail = "fail"  # stop before training, naming the first file (and how many more)
    skip = "skip"  # leave them out of the dataset, list them in the run dir (SKIPPED_FILES) and train on the rest

    def __str__(self) -> str:
        return self.value


# The image files DALI's file reader picks up by default (lower case; it also reads some audio files).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".pnm", ".ppm", ".pgm", ".pbm", ".jp2", ".webp")
SKIPPED_FILES = "skipped_files.txt"  # in the run dir, with data.bad_files=skip: "<path>\t<why>" per skipped file


# What DALI's image decoder reads, told by the first bytes of a file.
_FORMATS: tuple[tuple[str, Callable[[bytes], bool]], ...] = (
    ("JPEG", lambda h: h.startswith(b"\xff\xd8\xff")),
    ("PNG", lambda h: h.startswith(b"\x89PNG\r\n\x1a\n")),
    ("BMP", lambda h: h.startswith(b"BM")),
    ("TIFF", lambda h: h[:4] in (b"II*\x00", b"MM\x00*")),
    ("WebP", lambda h: h[:4] == b"RIFF" and h[8:12] == b"WEBP"),
    ("JPEG 2000", lambda h: h.startswith(b"\x00\x00\x00\x0cjP  \r\n\x87\n") or h.startswith(b"\xff\x4f\xff\x51")),
    ("PNM", lambda h: h[:1] == b"P" and h[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6")),
)
_END_MARKERS = {"JPEG": b"\xff\xd9", "PNG": b"IEND"}
KNOWN_FORMATS = ", ".join(name for name, _ in _FORMATS)


def images(count: int) -> str:
    """`count` images, for a line a user reads: "1 image", "360 images"."""
    return f"{count} image" if count == 1 else f"{count} images"


def image_format(head: bytes) -> str | None:
    """The image format that a file starting with `head` has (JPEG, PNG, ...), or None if DALI reads no such format."""
    return next((name for name, matches in _FORMATS if matches(head)), None)


def structural_problem(path: Path) -> str | None:
    """Why `path` cannot be a whole image file (empty, not an image format DALI decodes, no end marker), or None."""
    with open(path, "rb") as fh:
        head = fh.read(HEAD_BYTES)
        if not head:
            return "the file is empty"
        kind = image_format(head)
        if kind is None:
            return f"it is not an image file of a format DALI decodes ({KNOWN_FORMATS})"
        if kind in _END_MARKERS:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - TAIL_BYTES))
            if _END_MARKERS[kind] not in fh.read():
                return f"it is truncated (a {kind} file without its end marker)"
    return None


def decode_problem(path: Path) -> str | None:
    """Why `path` cannot be decoded without errors or warnings (the decoder's words), or None when it can."""
    problem = structural_problem(path)
    if problem:
        return problem
    data = Path(path).read_bytes()
    import simplejpeg  # outside the try: a decoder that is not installed is no fault of the file

    try:
        if image_format(data[:HEAD_BYTES]) == "JPEG":
            simplejpeg.decode_jpeg(data, strict=True)  # strict: libjpeg's "Corrupt JPEG data" warnings raise
        else:
            from PIL import Image

            with Image.open(io.BytesIO(data)) as img:
                img.load()
    except Exception as err:  # decoders raise many types for a damaged file; every one means "bad file"
        return f"it does not decode: {err or type(err).__name__}"
    return None


def find_bad_files(paths: list[Path], level: Verify | str, limit: int | None = 3) -> list[tuple[Path, str]]:
    """The first `limit` files of `paths` (all of them: None) that fail the check of `level` (quick or full),
    with the reason."""
    level = Verify(level)
    if level is Verify.off or not paths:
        return []
    check = structural_problem if level is Verify.quick else decode_problem
    workers = READ_WORKERS if level is Verify.quick else max(1, os.cpu_count() or 1)
    bad: list[tuple[Path, str]] = []

    def check_all(files: list[Path]) -> list[str | None]:  # a thread's share (a task per file cost more than the check)
        return [check(path) for path in files]

    with ThreadPoolExecutor(workers) as pool:
        for i in range(0, len(paths), CHUNK):
            part = paths[i : i + CHUNK]
            share = max(1, -(-len(part) // workers))  # one task per thread and chunk
            shares = [part[j : j + share] for j in range(0, len(part), share)]
            reasons = [why for share in pool.map(check_all, shares) for why in share]
            bad += [(p, why) for p, why in zip(part, reasons) if why]
            if limit is not None and len(bad) >= limit:
                break
    return bad if limit is None else bad[:limit]


# The files another process of the job found bad (path -> why), while `checked_already` holds: taken as the check's
# result instead of reading the files again
_checked: dict[str, str] | None = None


@contextmanager
def checked_already(bad: Iterable[tuple[Path | str, str]]) -> Iterator[None]:
    """Within it, `verify_files` reads no file: the files of `bad` (found by the job's own process) are its result,
    in the order of the paths it is given."""
    global _checked
    before, _checked = _checked, {str(path): why for path, why in bad}
    try:
        yield
    finally:
        _checked = before


def checked_already_holds() -> bool:
    """Whether this process takes another process's check of the files (it said what it left out)."""
    return _checked is not None


def absolute_names(paths: Iterable[Path | str]) -> list[str]:
    """Each path as os.path.abspath names it, each distinct folder made absolute once (a dataset's tens of thousands
    of files share a few folders)."""
    folders: dict[str, str] = {}
    names = []
    for path in paths:
        name = os.fspath(path)
        folder, separator, file = name.rpartition(os.sep)
        if not separator or file in ("", os.curdir, os.pardir):  # no folder, or one that abspath resolves itself
            names.append(os.path.abspath(name))
            continue
        within = folders.get(folder)
        if within is None:  # the folder's absolute name with its separator ("/" alone for the root)
            within = folders[folder] = os.path.join(os.path.abspath(folder or os.sep), "")
        names.append(within + file)
    return names


class CheckRecord:
    """The image files that passed a level of the check in earlier runs, kept in `folder` (one JSON file per dataset
    root and level: each file's absolute path, size and modification time when it passed), so that a later run reads
    only the files that are new or changed since. What passes now is kept only when `keep()` is called (once the run
    is accepted: a refused run changes nothing on disk)."""

    def __init__(self, folder: Path | None):
        self.folder = Path(folder) if folder is not None else None
        self._pending: list[tuple[Path, dict]] = []  # (record file, its content) to write on keep()
        self._named: tuple[list[Path], list[str]] | None = None  # the last list of paths unchanged() read, named

    def _file(self, names: list[str], level: Verify) -> Path | None:
        if self.folder is None or not names:
            return None
        # the files' common folder: that of their folders (the same, and far cheaper, for two files or more)
        root = names[0] if len(names) == 1 else os.path.commonpath({name.rpartition(os.sep)[0] for name in names})
        key = hashlib.sha1(f"{root}\n{level.value}".encode()).hexdigest()[:16]
        return self.folder / f"verified-{level.value}-{key}.json"

    def unchanged(self, paths: list[Path], level: Verify) -> tuple[list[bool], dict[str, list[int]]]:
        """(for each path, whether it passed `level` before and is unchanged since; each readable file's
        [size, mtime_ns] now, by absolute path)."""
        now: dict[str, list[int]] = {}
        names = absolute_names(paths)
        self._named = (paths, names)
        for name in names:
            try:
                stat = os.stat(name)
            except OSError:
                continue  # the check itself names a file that cannot be read
            now[name] = [stat.st_size, stat.st_mtime_ns]
        record = self._file(names, level)
        try:
            kept = json.loads(record.read_text())["files"] if record is not None else {}
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: every file is read
            kept = {}
        return [kept.get(name, False) == now.get(name, True) for name in names], now

    def passed(self, paths: list[Path], level: Verify, stats: dict[str, list[int]]) -> None:
        """`paths` passed `level` (unchanged since an earlier pass, or read now): kept on keep(), with `stats`."""
        names = self._named[1] if self._named is not None and self._named[0] is paths else absolute_names(paths)
        record = self._file(names, level)
        if record is not None:
            files = {name: stats[name] for name in names if name in stats}
            self._pending.append((record, {"level": level.value, "files": files}))

    def keep(self) -> None:
        """Write what passed in this run (each record whole: core.files.write_atomically); a folder that cannot be
        written is named in a warning, and later runs read every file again."""
        for record, content in self._pending:
            try:
                write_atomically(record, json.dumps(content).encode())
            except OSError as err:
                log.warning(
                    "could not keep the record of checked image files in %s (%s): later runs read every file again; "
                    "set paths.cache_dir to a writable folder, or null",
                    record.parent,
                    err.strerror or err,
                )
        self._pending.clear()


_record: CheckRecord | None = None  # while `remembering` holds: the files that passed in earlier runs


@contextmanager
def remembering(folder: Path | None) -> Iterator[CheckRecord]:
    """Within it, `verify_files` reads only the files that did not pass the same check in an earlier run or changed
    since (kept in `folder`; None: every file is read); the CheckRecord yielded keeps what passes now on keep()."""
    global _record
    before, _record = _record, CheckRecord(folder)
    try:
        yield _record
    finally:
        _record = before


def verify_files(paths: list[Path], level: Verify | str, limit: int | None = 3) -> list[tuple[Path, str]]:
    """`find_bad_files`, with a log line saying what was checked and how long it took (inside `checked_already`:
    the files it names, none read; inside `remembering`: the files unchanged since they passed not read again)."""
    level = Verify(level)
    if level is Verify.off:
        return []
    if _checked is not None:
        known = [(p, _checked[str(p)]) for p in paths if str(p) in _checked]
        return known if limit is None else known[:limit]
    started = time.perf_counter()
    log.info("checking %d image files (data.verify=%s)", len(paths), level.value)
    unchanged, stats = _record.unchanged(paths, level) if _record is not None else ([False] * len(paths), {})
    bad = find_bad_files([p for p, same in zip(paths, unchanged) if not same], level, limit)
    if _record is not None and (limit is None or not bad):  # every file read or remembered: what passed is known
        named = {str(p) for p, _ in bad}
        _record.passed([p for p in paths if str(p) not in named] if named else paths, level, stats)
    kept = sum(unchanged)
    remembered = f" ({kept} unchanged since an earlier run's check, not read again)" if kept else ""
    log.info(
        "checked %d image files in %.1f s: %s%s",
        len(paths),
        time.perf_counter() - started,
        f"{len(bad)} bad file(s) found" if bad else "all whole",
        remembered,
    )
    return bad


def bad_files_message(bad: Iterable[tuple[Path, str]], hint: str = "") -> str:
    """One line naming the first bad file, why, how many more, and what to do."""
    bad = list(bad)
    path, why = bad[0]
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"cannot decode {path}{more}: {why}. Remove or replace the file{hint}"


def write_skipped_files(run_dir: Path, skipped: Iterable[tuple[Path, str]]) -> Path:
    """Write the files a run left out (data.bad_files=skip) to `run_dir`/SKIPPED_FILES, one "<absolute path>\t<why>"
    line each; return its path."""
    path = Path(run_dir) / SKIPPED_FILES
    path.write_text("".join(f"{os.path.abspath(file)}\t{why}\n" for file, why in skipped))
    return path
