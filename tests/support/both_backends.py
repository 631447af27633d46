"""The same experiments trained once by each backend, from the command line as a user runs them: what the agreement
tests (tests/test_backends_agree.py) compare, and the trained runs that hydrali eval, predict and export use
(tests/test_after_training.py); and the short detection runs of each backend. Shared by the session (conftest.py:
trained_on_both, detection_runs)."""

from __future__ import annotations

from pathlib import Path

from tests.support.checks import read_summary
from tests.support.cli import run_cli
from tests.support.configs import SMALL_NET

# digits, 2 epochs, SGD with weight decay 1e-4 and label smoothing 0.1 (acceptance of the agreement), the mean
# gradient of 2 batches per optimizer step (Lightning's accumulation and Keras' own), on a narrow network at 16 x 16:
# what is checked is how each backend runs the experiment, not what it learns
SAME = [
    "epochs=2",
    "optim.weight_decay=1e-4",
    "task.label_smoothing=0.1",
    "optim.accumulate_grad_batches=2",
    *SMALL_NET,
]
IMPORT_PROBE = (
    "import atexit, runpy, sys; "
    "atexit.register(lambda: print('LOADED', 'torch' in sys.modules, 'tensorflow' in sys.modules)); "
    "sys.argv = ['hydrali'] + sys.argv[1:]; runpy.run_module('hydrali.core', run_name='__main__')"
)


def run_with_probe(tmp_path: Path, data_dir: Path, name: str, *args: str):
    """`hydrali <SAME> <args>` in tmp_path/name (MLflow store tmp_path/mlflow.db), printing at its end whether
    torch and TensorFlow were imported: (completed process, its summary)."""
    out = run_cli(
        f"paths.data_dir={data_dir}",
        f"hydra.run.dir={tmp_path / name}",
        *SAME,
        *args,
        cwd=tmp_path,
        timeout=900,
        entry=("-c", IMPORT_PROBE),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out, read_summary(tmp_path / name)


def train_on_both(tmp_path: Path, data_dir: Path):
    """(tmp_path, (output, summary) of the Lightning run, the same of the Keras run), in tmp_path/<backend>."""
    # default progress settings, output to a pipe: as a run whose output goes to a file or a CI log
    lightning = run_with_probe(tmp_path, data_dir, "lightning", "backend=lightning")
    keras = run_with_probe(tmp_path, data_dir, "keras", "backend=keras")
    return tmp_path, lightning, keras


SHORT_DETECTION = ["task=detection", "epochs=5"]  # the bundled digits_detection, 5 epochs


def detection_on_both(root: Path, data_dir: Path):
    """5 epochs of the default detection run on each backend, tracked in one MLflow store under `root`:
    (root, backend -> summary), the runs in root/<backend>."""
    runs = {}
    for backend in ("lightning", "keras"):
        out = run_cli(
            *SHORT_DETECTION,
            f"backend={backend}",
            f"paths.data_dir={data_dir}",
            f"paths.root={root}",
            f"hydra.run.dir={root / backend}",
            cwd=root,
            timeout=900,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs[backend] = read_summary(root / backend)
    return root, runs
