"""Hints that send the user the right way: `~` in a path is the home folder, a value that a space split is named with
its quoting, `hydrali ui --help` helps, and a checkpoint that cannot be read or an out= that is a file says so, each in
one line with exit code 2 and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checks import fails_with
from tests.support.cli import run_cli


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_tilde_in_a_path_is_the_home_folder_quoted_or_not(tmp_path):
    for value in ("~/photos", "'~/my photos'"):
        shown = run_cli("--cfg", "job", "data=imagefolder", f"data.root={value}", cwd=tmp_path, env={"HOME": "/home/u"})
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert f"  root: {value.strip(chr(39)).replace('~', '/home/u')}\n" in shown.stdout


def test_a_value_split_by_a_space_and_ui_help_are_named(tmp_path):
    sweep = run_cli("-m", "optim.lr=0.05,", "0.1", cwd=tmp_path)
    fails_with(sweep, "optim.lr=0.05, 0.1: a sweep's values take no spaces: write optim.lr=0.05,0.1")
    folder = run_cli("data=imagefolder", "data.root=/tmp/my", "photos", cwd=tmp_path)
    fails_with(
        folder,
        "photos is not key=value: a space split the value of data.root; quote it: \"data.root='/tmp/my photos'\"",
    )
    helped = run_cli("ui", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: hydrali ui [key=value ...]"), helped.stderr
    fails_with(run_cli("ui", "--bogus", cwd=tmp_path), "(--bogus is not an option here)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_checkpoint_cut_short_and_an_out_that_is_a_file_are_one_line_each(trained_on_both, tmp_path, data_dir):
    root = trained_on_both[0]
    before = _files(root)
    for backend, pattern in (("lightning", "*.ckpt"), ("keras", "*.weights.h5")):
        original = sorted((root / backend / "checkpoints").glob(pattern))[-1]
        cut = tmp_path / original.name
        cut.write_bytes(original.read_bytes()[: original.stat().st_size // 2])
        fails_with(
            run_cli("eval", str(root / backend), f"ckpt={cut}", cwd=root),
            f"ckpt={cut}: {cut} cannot be read as a checkpoint (",
            "cut short or damaged",
        )
    resumed = run_cli(
        f"ckpt_path={cut}", "backend=keras", f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / 'run'}", cwd=root
    )
    fails_with(resumed, f"ckpt_path={cut}: {cut} cannot be read as a checkpoint (an HDF5 file cut short")
    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("mine")
    fails_with(
        run_cli("export", str(root / "lightning"), f"out={in_the_way}", cwd=root),
        "a file is in the way of a folder to write: pass out=<a new folder>",
    )
    assert _files(root) == before and in_the_way.read_text() == "mine"
    assert not (tmp_path / "run").exists()
