"""backend.xla_cache: a Keras run with XLA keeps its compiled steps under paths.cache_dir, and a later run of the same
network reads them (as TensorFlow itself reports, one notice per entry it reads, which the run counts and holds back)
and keeps nothing twice, also when started from another hydrali process; a run with xla_cache=null keeps nothing."""

from __future__ import annotations

from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, TINY

XLA_RUN = ["backend=keras", "backend.compile=true", "epochs=1", "tracking=none", *TINY, *KERAS_QUIET]
NOTICE = "XlaSerializedCacheEntry"  # TensorFlow's notice for an entry it reads (it tries the text format first)


def _run(tmp_path, data_dir, name: str, *extra: str, env: dict[str, str] | None = None):
    out = run_cli(
        *XLA_RUN,
        f"paths.root={tmp_path}",
        f"paths.data_dir={data_dir}",
        f"hydra.run.dir={tmp_path / name}",
        *extra,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr  # hydrali's log, and TensorFlow's C++ output


def _entries(tmp_path) -> dict[str, int]:
    """The kept entries (path under the cache: modification time in ns)."""
    cache = tmp_path / ".hydrali_cache" / "xla"
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*.pb")} if cache.exists() else {}


def test_a_later_keras_run_reads_the_compiled_steps_an_earlier_one_kept(tmp_path, data_dir):
    off = _run(tmp_path, data_dir, "off", "backend.xla_cache=null")
    assert _entries(tmp_path) == {}, "xla_cache=null keeps nothing"
    assert "backend.xla_cache" not in off

    first = _run(tmp_path, data_dir, "first")
    kept = _entries(tmp_path)
    assert len(kept) >= 1, first[-3000:]  # the train step, and the test step of its validation
    assert all(name.startswith("tf") and "-cpu/" in name for name in kept), kept  # by TensorFlow and device
    assert f"kept {len(kept)} compiled step(s) for later runs" in first

    # started by a hydrali process that named its own folder for TensorFlow (the environment a child inherits)
    parents = str(tmp_path / "parent-process-folder")
    inherited = {
        "TF_XLA_FLAGS": f"--tf_xla_persistent_cache_directory={parents}",
        "HYDRALI_XLA_PROCESS_FOLDER": parents,
    }
    second = _run(tmp_path, data_dir, "second", env=inherited)
    assert f"TensorFlow read {len(kept)} of the {len(kept)} compiled step(s) kept by earlier runs" in second
    assert NOTICE not in second, "TensorFlow's notices of the entries it read are held back"
    assert _entries(tmp_path) == kept, "nothing kept twice, nothing rewritten"
    assert not (tmp_path / "parent-process-folder").exists(), "the child used a folder of its own"
