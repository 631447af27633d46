"""The file check judges content, not names, and accepts every format DALI decodes; `data.verify=full` names a JPEG
damaged in its middle (which DALI decodes with only libjpeg's unnamed warning)."""

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hydrali.core.data.image_files import (
    absolute_names,
    decode_problem,
    find_bad_files,
    remembering,
    structural_problem,
    verify_files,
)
from hydrali.core.errors import HydraliError
from hydrali.core.run.runner import run
from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import LIGHTNING_QUIET, TINY, compose_config

FORMATS = {"JPEG": "jpg", "PNG": "png", "BMP": "bmp", "TIFF": "tif", "WEBP": "webp", "PPM": "ppm"}


def _picture(seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (48, 40, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _damaged_in_the_middle(path: Path) -> None:
    """A JPEG with garbage over its middle: signature and end marker intact."""
    buf = io.BytesIO()
    _picture().save(buf, format="JPEG", quality=90)
    data = bytearray(buf.getvalue())
    middle = len(data) // 2
    data[middle : middle + 200] = np.random.default_rng(1).integers(0, 256, 200, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def _dali_decodes(folder: Path) -> int:
    """How many files of `folder` DALI's CPU decoder turns into images (it reads a file list, names ignored)."""
    from nvidia.dali import fn, pipeline_def, types

    files = sorted(p for p in folder.iterdir())
    (folder / "list.txt").write_text("".join(f"{p.name} 0\n" for p in files))

    @pipeline_def(batch_size=len(files), num_threads=1, device_id=None)
    def decode():
        raw, _ = fn.readers.file(file_root=str(folder), file_list=str(folder / "list.txt"))
        return fn.decoders.image(raw, device="cpu", output_type=types.RGB)

    pipe = decode()
    pipe.build()
    (images,) = pipe.run()
    return sum(1 for i in range(len(files)) if np.asarray(images[i]).shape[:2] == (48, 40))


def test_every_format_dali_decodes_passes_the_check_whatever_its_name(tmp_path):
    for fmt, ext in FORMATS.items():
        _picture().save(tmp_path / f"as-{ext}.{ext}", format=fmt)
        _picture().save(tmp_path / f"{fmt.lower()}-named.jpg", format=fmt)  # content and name disagree
    files = sorted(tmp_path.iterdir())
    assert _dali_decodes(tmp_path) == len(files), "DALI decodes each of them"
    assert [(p.name, structural_problem(p), decode_problem(p)) for p in files] == [(p.name, None, None) for p in files]


def test_a_decoder_that_is_not_installed_blames_no_file(tmp_path, monkeypatch):
    """Without simplejpeg (as on a machine set up by hand), a good JPEG is not reported as one that does not
    decode: the missing module is raised as itself."""
    good = tmp_path / "good.jpg"
    _picture().save(good, format="JPEG")
    monkeypatch.setitem(__import__("sys").modules, "simplejpeg", None)  # `import simplejpeg` raises ImportError
    with pytest.raises(ImportError):
        decode_problem(good)


def test_foreign_truncated_and_damaged_files_are_told_apart(tmp_path):
    (tmp_path / "notes.jpg").write_text("not an image at all")
    whole = io.BytesIO()
    _picture().save(whole, format="PNG")
    (tmp_path / "cut.png").write_bytes(whole.getvalue()[:300])
    _damaged_in_the_middle(tmp_path / "middle.jpg")
    assert "not an image file of a format DALI decodes" in structural_problem(tmp_path / "notes.jpg")
    assert "truncated (a PNG file without its end marker)" in structural_problem(tmp_path / "cut.png")
    assert structural_problem(tmp_path / "middle.jpg") is None, "quick reads only the ends"
    assert decode_problem(tmp_path / "middle.jpg").startswith("it does not decode")
    paths = sorted(tmp_path.iterdir())
    assert [p.name for p, _ in find_bad_files(paths, "full")] == ["cut.png", "middle.jpg", "notes.jpg"]
    assert [p.name for p, _ in find_bad_files(paths, "full", limit=1)] == ["cut.png"]
    assert find_bad_files(paths, "off") == []


def test_a_jpeg_damaged_in_its_middle_is_named_with_data_verify_full(tmp_path, digits_copy):
    victim = sorted((digits_copy / "train" / "5").glob("*.jpg"))[3]
    _damaged_in_the_middle(victim)
    out = run_cli(
        "data=imagefolder",
        f"data.root={digits_copy}",
        "data.image_size=32",
        "data.verify=full",
        "epochs=1",
        "tracking=none",
        cwd=tmp_path,
    )
    fails_with(out, f"cannot decode {victim}: it does not decode", "Remove or replace the file")
    assert out.returncode == 2


@pytest.mark.slow
def test_a_png_named_jpg_trains(tmp_path, digits_copy):
    victim = sorted((digits_copy / "train" / "2").glob("*.jpg"))[0]
    with Image.open(victim) as img:
        img.load()
        img.save(victim, format="PNG")
    assert victim.read_bytes().startswith(b"\x89PNG")
    run_dir = tmp_path / "run"
    out = run_cli(
        "data=imagefolder",
        f"data.root={digits_copy}",
        "data.image_size=32",
        "data.verify=full",
        "epochs=1",
        "tracking=none",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert read_summary(run_dir)["epochs"] == 1


def _checked_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("checked ")]


@pytest.mark.slow
def test_a_later_run_reads_only_files_changed_since_they_passed_and_a_refused_run_keeps_nothing(
    tmp_path, data_dir, digits_copy, caplog
):
    """paths.cache_dir: what passed data.verify is kept after the run is accepted; a file changed since is read."""
    caplog.set_level("INFO", logger="hydrali")
    record_dir = tmp_path / ".hydrali_cache"  # paths.cache_dir under paths.root, as a user's runs keep it

    def train(name: str, *overrides: str) -> None:
        data = ["data=imagefolder", f"data.root={digits_copy}", "data.image_size=16", "epochs=1", "tracking=none"]
        run(compose_config([*TINY, *LIGHTNING_QUIET, *data, *overrides], tmp_path, data_dir, tmp_path / name))

    with pytest.raises(HydraliError, match="ckpt_path=nowhere.ckpt"):  # refused after the data check passed
        train("refused", "ckpt_path=nowhere.ckpt")
    assert not record_dir.exists()
    train("first")
    files = len(list(digits_copy.rglob("*.jpg")))
    assert _checked_lines(caplog)[-1] == f"checked {files} image files in {_seconds(caplog)} s: all whole"
    records = list(record_dir.iterdir())
    assert len(records) == 1

    train("second")
    assert _checked_lines(caplog)[-1].endswith(f"({files} unchanged since an earlier run's check, not read again)")

    victim = sorted((digits_copy / "val" / "7").glob("*.jpg"))[0]
    victim.write_bytes(victim.read_bytes()[:100])  # cut short: its size changed, so it is read again
    kept = records[0].read_bytes()
    with pytest.raises(HydraliError, match=f"{victim}: it is truncated"):
        train("third")
    assert _checked_lines(caplog)[-1].endswith(f"({files - 1} unchanged since an earlier run's check, not read again)")
    assert list(record_dir.iterdir()) == records and records[0].read_bytes() == kept


def _seconds(caplog) -> str:
    """The seconds the last `checked` line gives, as it wrote them."""
    return _checked_lines(caplog)[-1].split(" in ")[1].split(" s:")[0]


def test_a_file_unchanged_since_it_passed_is_not_read_again_and_a_touched_one_is(tmp_path):
    """The record trusts a file's path, size and modification time: damage that keeps all three goes unseen (as the
    conf/paths/default.yaml comment says); a new modification time is read."""
    for i in range(3):
        _picture(i).save(tmp_path / f"{i}.jpg", format="JPEG")
    files = sorted(tmp_path.glob("*.jpg"))
    with remembering(tmp_path / "cache") as record:
        assert verify_files(files, "quick") == []
        record.keep()
    victim = files[1]
    stat = victim.stat()
    victim.write_bytes(b"\0" * stat.st_size)  # no image any more, the same size
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same modification time
    with remembering(tmp_path / "cache"):
        assert verify_files(files, "quick") == []  # not read
    os.utime(victim)  # touched: now
    with remembering(tmp_path / "cache"):
        assert [(p, why.split(" (")[0]) for p, why in verify_files(files, "quick")] == [
            (victim, "it is not an image file of a format DALI decodes")
        ]


def test_the_check_record_names_each_file_as_abspath_does(tmp_path, monkeypatch):
    """The record's keys (each file's absolute name, its folder made absolute once) are os.path.abspath's, for
    relative, dotted, doubled and root paths alike: a record written by one run matches the next run's files."""
    monkeypatch.chdir(tmp_path)
    paths = [
        "a/b.jpg",
        "/x/y/../z.jpg",
        "./c.jpg",
        "d.jpg",
        "/e.jpg",
        "//f/g.jpg",
        "a//b/./c.jpg",
        "a/..",
        "a/.",
        "a/",
        "/",
        "../x.jpg",
        Path("cls") / "img.png",
    ]
    assert absolute_names(paths) == [os.path.abspath(p) for p in paths]
