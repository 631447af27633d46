"""A refused attempt changes nothing: after each, the MLflow store's runs (ids, statuses, params, metrics) and
every file under the runs' root are as they were; each ends with exit code 2 and one line, within seconds (at most
twice the time Python takes to import Lightning on the machine as loaded)."""

import hashlib
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.support.checks import fails_with
from tests.support.cli import lightning_startup_seconds, run_cli
from tests.support.configs import TINY

pytestmark = pytest.mark.slow
OTHER_WIDTHS = "model.widths=[16,32,64]"  # the finished runs have TINY's [8, 16, 32]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir) -> Path:
    """A root with one finished 1-epoch run per backend (root/lightning, root/keras) and their MLflow store."""
    root = tmp_path_factory.mktemp("finished")
    for backend in ("lightning", "keras"):
        out = run_cli(
            f"backend={backend}",
            "epochs=1",
            *TINY,
            f"paths.root={root}",
            f"paths.data_dir={data_dir}",
            f"hydra.run.dir={root / backend}",
            cwd=root,
        )
        assert out.returncode == 0, out.stderr[-3000:]
    return root


def _snapshot(root: Path):
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    store = sorted(
        (r.info.run_id, r.info.status, sorted(r.data.params.items()), sorted(r.data.metrics.items())) for r in runs
    )
    files = sorted(
        (str(p.relative_to(root)), p.stat().st_mtime_ns, hashlib.md5(p.read_bytes()).hexdigest())
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith("mlflow.db")
    )
    dirs = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir())
    return store, files, dirs


def _attempts(root: Path) -> dict:
    lightning, keras = root / "lightning", root / "keras"
    (root / "notes.ckpt").write_text("not a checkpoint")  # written before the first snapshot
    keras_ckpt = sorted((keras / "checkpoints").glob("*.weights.h5"))[-1]
    return {
        "keras resuming a Lightning run": (
            ["backend=keras", f"ckpt_path={lightning / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={lightning}"],
            "is a checkpoint of backend=lightning",
        ),
        "Lightning resuming a Keras run": (
            ["backend=lightning", f"ckpt_path={keras_ckpt}", f"hydra.run.dir={keras}"],
            "is a checkpoint of backend=keras",
        ),
        "ckpt_path=last in a fresh dir": (
            ["ckpt_path=last", f"hydra.run.dir={root / 'fresh'}"],
            "holds no lightning checkpoint",
        ),
        "a checkpoint path that does not exist": (
            [f"ckpt_path={root / 'nope.ckpt'}", f"hydra.run.dir={root / 'fresh'}"],
            "is not a file",
        ),
        "a text file named .ckpt": (
            [f"ckpt_path={root / 'notes.ckpt'}", f"hydra.run.dir={root / 'fresh'}"],
            "cannot be read as a Lightning checkpoint",
        ),
        # (ckpt_path=last there is the same command again, which says the run is finished: tests/test_rerun.py)
        "a finished Lightning run's checkpoint by path": (
            ["epochs=1", f"ckpt_path={lightning / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={lightning}"],
            "holds 1 trained epochs and the run asks for epochs=1",
        ),
        "a finished Keras run's checkpoint by path": (
            ["backend=keras", "epochs=1", f"ckpt_path={keras_ckpt}", f"hydra.run.dir={keras}"],
            "holds 1 trained epochs",
        ),
        "another model on Lightning": (
            ["epochs=3", OTHER_WIDTHS, "ckpt_path=last", f"hydra.run.dir={lightning}"],
            "was trained with other settings (model.widths is [8, 16, 32] there, [16, 32, 64] here)",
        ),
        "another model on Keras": (
            ["backend=keras", "epochs=3", OTHER_WIDTHS, "ckpt_path=last", f"hydra.run.dir={keras}"],
            "was trained with other settings (model.widths",
        ),
    }


@pytest.mark.parametrize(
    "name",
    [
        "keras resuming a Lightning run",
        "Lightning resuming a Keras run",
        "ckpt_path=last in a fresh dir",
        "a checkpoint path that does not exist",
        "a text file named .ckpt",
        "a finished Lightning run's checkpoint by path",
        "a finished Keras run's checkpoint by path",
        "another model on Lightning",
        "another model on Keras",
    ],
)
def test_a_refused_attempt_changes_nothing(finished, data_dir, name):
    args, needle = _attempts(finished)[name]
    before = _snapshot(finished)
    started = time.monotonic()
    out = run_cli(*args, f"paths.root={finished}", f"paths.data_dir={data_dir}", cwd=finished)
    elapsed = time.monotonic() - started
    fails_with(out, needle)
    # no training, no data pass: at most the work of starting Python with Lightning twice over
    bound = 2 * lightning_startup_seconds() + 2
    assert elapsed < bound, f"{name}: refused after {elapsed:.0f} s (bound {bound:.0f} s)"
    assert _snapshot(finished) == before, name


def test_another_models_checkpoint_from_elsewhere_is_one_line(finished, data_dir, tmp_path):
    # a checkpoint copied out of its run dir (no trained_with.json beside it): Lightning's loader is the judge
    copy = tmp_path / "copied.ckpt"
    copy.write_bytes((finished / "lightning" / "checkpoints" / "last.ckpt").read_bytes())
    out = run_cli(
        "epochs=2", OTHER_WIDTHS, f"ckpt_path={copy}", "tracking=none", f"paths.data_dir={data_dir}", cwd=tmp_path
    )
    fails_with(out, f"ckpt_path={copy} holds the weights of another model", "size mismatch")
