"""Both backends as a user sees them: the same MLflow params and metrics, and only their own framework."""
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import read_summary, run_cli

pytestmark = pytest.mark.slow

TINY = ["epochs=1", "backend.trainer.enable_progress_bar=false"]
IMPORT_PROBE = ("import atexit, runpy, sys; "
                "atexit.register(lambda: print('LOADED', 'torch' in sys.modules, 'tensorflow' in sys.modules)); "
                "sys.argv = ['hydrali'] + sys.argv[1:]; runpy.run_module('core', run_name='__main__')")


def _run_with_probe(tmp_path, data_dir, name, *args):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", IMPORT_PROBE, f"paths.data_dir={data_dir}",
                          f"hydra.run.dir={tmp_path / name}", "epochs=1", *args],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1], read_summary(tmp_path / name)


def test_each_backend_loads_only_its_framework_and_both_log_the_same_keys(tmp_path, data_dir):
    torch_line, lightning = _run_with_probe(tmp_path, data_dir, "lightning", "backend=lightning",
                                            "backend.trainer.enable_progress_bar=false")
    tf_line, keras = _run_with_probe(tmp_path, data_dir, "keras", "backend=keras", "backend.verbose=0")
    assert torch_line == "LOADED True False", "a Lightning run never imports tensorflow"
    assert tf_line == "LOADED False True", "a Keras run never imports torch"

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = {s["backend"]: client.get_run(s["mlflow_run_id"]).data for s in (lightning, keras)}
    # backend.* holds each backend's own options (devices vs replicas, ...): everything else is shared
    shared = {b: {k for k in d.params if not k.startswith("backend.")} for b, d in runs.items()}
    assert shared["lightning"] == shared["keras"]
    for key in ("optim.lr", "data.batch_size", "plan/effective_lr", "plan/global_batch", "plan/world_size"):
        assert runs["lightning"].params[key] == runs["keras"].params[key], key
    assert set(runs["lightning"].metrics) == set(runs["keras"].metrics) == {"train/loss", "val/loss", "val/acc", "lr"}
