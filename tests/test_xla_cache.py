"""backend.xla_cache: a Keras run with XLA keeps its compiled steps under paths.cache_dir, and a later run of the same
network reads them (as TensorFlow itself reports: one notice per entry it reads) and keeps nothing twice, also when
started from another hydrali process; a run with xla_cache=null keeps nothing."""

from __future__ import annotations

import re

from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, TINY

XLA_RUN = ["backend=keras", "backend.compile=true", "epochs=1", "tracking=none", *TINY, *KERAS_QUIET]
NOTICE = "XlaSerializedCacheEntry"  # TensorFlow's notice for an entry it reads (it tries the text format first)
# TensorFlow's C++ log level as a shell that never set it gets (hydrali's default, backends/keras/__init__.py): this
# test process may have imported tf2onnx (an ONNX export test), which sets 3 in os.environ and so hides the notices
SHELL_LOG_LEVEL = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _run(tmp_path, data_dir, name: str, *extra: str, env: dict[str, str] | None = None):
    out = run_cli(
        *XLA_RUN,
        f"paths.root={tmp_path}",
        f"paths.data_dir={data_dir}",
        f"hydra.run.dir={tmp_path / name}",
        *extra,
        cwd=tmp_path,
        env={**SHELL_LOG_LEVEL, **(env or {})},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr  # hydrali's log, and TensorFlow's C++ output


def _tensorflow_notices(output: str) -> int:
    """TensorFlow's own lines about a kept entry it read (hydrali's log line that names the notice left out)."""
    return sum(NOTICE in line and "backend.xla_cache" not in line for line in output.splitlines())


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
    assert all(re.match(r"tf[0-9.]+-cpu-[0-9a-f]{8}/", name) for name in kept), kept  # TensorFlow, device, flags
    assert f"kept {len(kept)} compiled step(s) for later runs" in first

    # started by a hydrali process that named its own folder for TensorFlow (the environment a child inherits)
    parents = str(tmp_path / "parent-process-folder")
    inherited = {
        "TF_XLA_FLAGS": f"--tf_xla_persistent_cache_directory={parents}",
        "HYDRALI_XLA_PROCESS_FOLDER": parents,
    }
    second = _run(tmp_path, data_dir, "second", env=inherited)
    assert f"{len(kept)} compiled step(s) kept by earlier runs" in second
    assert _tensorflow_notices(second) >= len(kept), "TensorFlow read every kept entry"
    assert _tensorflow_notices(first) == 0
    assert _entries(tmp_path) == kept, "nothing kept twice, nothing rewritten"
    assert not (tmp_path / "parent-process-folder").exists(), "the child used a folder of its own"


def test_a_job_of_an_lr_sweep_reads_the_steps_another_lr_compiled(tmp_path, data_dir):
    """The jobs of a sweep over optim.lr compile one step between them: the lr is read by the step, not part of it."""
    first = _run(tmp_path, data_dir, "lr-0.1", "optim.lr=0.1")
    kept = _entries(tmp_path)
    assert len(kept) >= 1, first[-3000:]
    other = _run(tmp_path, data_dir, "lr-0.3", "optim.lr=0.3")
    assert _tensorflow_notices(other) >= len(kept), "TensorFlow read every kept entry: " + other[-3000:]
    assert _entries(tmp_path) == kept, "the other lr compiled nothing new"
