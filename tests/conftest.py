"""Shared fixtures: configs composed through Hydra's compose API, and the CLI run as a subprocess."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from hydrali.core.config.schema import register_schemas
from hydrali.tasks.classification.datasets import write_digits

REPO = Path(__file__).resolve().parents[1]
# A narrow network on 16 x 16 images: for tests of what happens around training, not of what it learns
SMALL_NET = ["model.widths=[8,16,32]", "data.image_size=16"]


@pytest.fixture(scope="session", autouse=True)
def two_logical_cpus():
    """TensorFlow splits the CPU into logical devices only before its runtime starts, once per process: split it
    into 2 before any test runs, so that every in-process Keras run (1 or 2 replicas) finds what it needs."""
    from hydrali.backends.keras.strategy import configure_devices
    configure_devices(2, "cpu")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One data dir for the whole session, so the digits JPEG files are written once."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture
def digits_copy(tmp_path, data_dir) -> Path:
    """A private copy of the digits dataset that the test may damage."""
    source = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    copy = tmp_path / "damaged"
    shutil.copytree(source, copy)
    return copy


def compose_config(overrides: list[str], root: Path, data_dir: Path, output_dir: Path | None = None):
    """The config `hydrali <overrides>` would run, with its paths under `root` (HydraConfig set, as at run time)."""
    register_schemas()
    GlobalHydra.instance().clear()
    output_dir = output_dir or root / "run"
    with initialize_config_module(config_module="hydrali.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={root}", f"paths.data_dir={data_dir}",
                                           f"hydra.run.dir={output_dir}", *overrides],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        del cfg["hydra"]
    return cfg


@pytest.fixture
def make_cfg(tmp_path, data_dir):
    """compose_config bound to this test's tmp dir and the session's data dir."""
    def make(*overrides: str, output_dir: Path | None = None):
        return compose_config(list(overrides), tmp_path, data_dir, output_dir)
    return make


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python -m hydrali.core <args>` in `cwd`, as a user would run `hydrali`."""
    full_env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "hydrali.core", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def as_from_a_terminal() -> None:
    """Popen's preexec_fn for a run the test presses Ctrl+C in: SIGINT as a terminal delivers it, even when the
    tests themselves were started in the background (where a shell makes them, and their children, ignore it)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_summary(output_dir: Path) -> dict:
    """The summary.json a run wrote."""
    return json.loads((Path(output_dir) / "summary.json").read_text())


# The worst validation loss is the first epoch's (a small, steady lr): monitoring val/loss with
# mode=max makes the best epoch fall before an interruption at epoch 2, as a user's best often does.
RESUME_ARGS = ["epochs=3", "task.monitor=val/loss", "task.mode=max", "optim.lr=0.02", "optim.warmup_epochs=0"]


def check_resume_keeps_the_record(make_cfg, tmp_path: Path, args: list[str], interrupt: str, raises) -> dict:
    """Run 3 epochs whole; run them again interrupted at epoch 2 and resumed with ckpt_path=last; check that
    the resumed run's record, best value and best checkpoint are the uninterrupted run's. Returns its summary."""
    from mlflow.tracking import MlflowClient

    from hydrali.core.run.runner import run

    whole_dir, resumed_dir = tmp_path / "whole", tmp_path / "resumed"
    whole_value = run(make_cfg(*RESUME_ARGS, *args, output_dir=whole_dir))
    whole = read_summary(whole_dir)
    assert whole["best_epoch"] == 0, "the test needs the best epoch before the interruption"

    stop = f"+backend.callbacks.interrupt={{_target_: {interrupt}, epoch: 2}}"
    with pytest.raises(raises):
        run(make_cfg(*RESUME_ARGS, *args, stop, output_dir=resumed_dir))
    assert not (resumed_dir / "summary.json").exists()
    # data.verify changes on resume: a changed param is logged under resume1/, not dropped
    value = run(make_cfg(*RESUME_ARGS, *args, "ckpt_path=last", "data.verify=off", output_dir=resumed_dir))
    resumed = read_summary(resumed_dir)

    assert (resumed["first_epoch"], resumed["epochs"]) == (2, 3)
    assert [row["epoch"] for row in resumed["history"]] == [0, 1, 2]
    assert resumed["history"][:2] == whole["history"][:2], "the epochs before the interruption are kept as they were"
    assert resumed["best"] == whole["best"] and resumed["best_epoch"] == 0
    assert value == whole_value == whole["best"]["val/loss"], "the sweeper gets the best of the whole run"
    assert Path(resumed["best_checkpoint"]).is_file(), "the best checkpoint survives the interruption"
    assert resumed["train_images"] == whole["train_images"]
    client = MlflowClient(make_cfg().tracking.uri)
    run_ = client.get_run(resumed["mlflow_run_id"])
    assert [m.step for m in client.get_metric_history(run_.info.run_id, "val/loss")] == [0, 1, 2]
    assert (run_.data.params["data.verify"], run_.data.params["resume1/data.verify"]) == ("quick", "off")
    return resumed


def check_validation_every_second_epoch(make_cfg, tmp_path: Path, args: list[str]) -> None:
    """3 epochs validating every second one: epochs 0 and 2 have no val metrics anywhere."""
    from mlflow.tracking import MlflowClient

    from hydrali.core.run.runner import run

    out = tmp_path / "every2"
    run(make_cfg("epochs=3", *SMALL_NET, *args, output_dir=out))
    summary = read_summary(out)
    val_keys = [sorted(k for k in row if k.startswith("val/")) for row in summary["history"]]
    assert val_keys[0] == val_keys[2] == [] and "val/acc" in val_keys[1]
    assert not any(k.startswith("val/") for k in summary["final"]), "the last epoch did not validate"
    assert summary["best_epoch"] == 1 and summary["val_images"] == 360
    client = MlflowClient(make_cfg().tracking.uri)
    assert [m.step for m in client.get_metric_history(summary["mlflow_run_id"], "val/acc")] == [1]


def check_each_val_image_counted_once(summary: dict, val_set: int = 360) -> None:
    """Every validation scored the whole set once: the count, and an accuracy that is k / val_set."""
    assert summary["val_images"] == val_set
    for row in summary["history"]:
        assert row["val/images"] == val_set
        assert abs(row["val/acc"] * val_set - round(row["val/acc"] * val_set)) < 1e-3, row
