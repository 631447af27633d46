"""Shared fixtures: the session's data dir, configs composed through Hydra's compose API, and TensorFlow's CPU split
into 2 logical devices for a session that holds a Keras test; under pytest-xdist, how the files go to the workers
and one compute thread per framework in each worker. The helpers they use live in tests/support/."""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker of `pytest -n N`, set before torch or TensorFlow is imported
    # N workers share the machine's cores (make test: 2 on CI's 2 cores): torch's OpenMP pool and TensorFlow's
    # intra-op pool of one thread in each worker and each hydrali it starts, rather than one per core each, which
    # oversubscribes the cores and spends them waiting (measured on 2 cores under -n 2: tests/test_training.py and
    # test_interrupt.py took 320 s and 544 CPU-s with 2 threads each, 202 s and 324 CPU-s with these at 1).
    # TensorFlow's inter-op pool is left as it is: the replicas of a Keras run wait on each other in it. A value set
    # by the caller stays.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import shutil
from pathlib import Path

import pytest

# TensorFlow's environment as a hydrali Keras run sets it (oneDNN's CPU kernels, its log level), before any test
# module imports TensorFlow: the same kernels in every test process
import hydrali.backends.keras  # noqa: F401
from hydrali.tasks.classification.datasets import write_digits
from tests.support.configs import compose_config


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # optional: a run without pytest-xdist; first: over xdist's own
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile hands out whole files, the files that share the session's trained runs as one unit, longest
    first (tests/support/scheduling.py); any other --dist is xdist's own."""
    if config.getvalue("dist") == "loadfile":
        from tests.support.scheduling import SharedRunsFirstScheduling

        return SharedRunsFirstScheduling(config, log)
    return None


@pytest.fixture(scope="session", autouse=True)
def two_logical_cpus(request):
    """TensorFlow splits the CPU into logical devices only before its runtime starts, once per process: when the
    session holds a test marked `keras` (TensorFlow in the test process), split it into 2 before any test runs, so
    that every in-process Keras run (1 or 2 replicas) finds what it needs. A session without one never loads
    TensorFlow."""
    if any(item.get_closest_marker("keras") for item in request.session.items):
        from hydrali.backends.keras.strategy import configure_devices

        configure_devices(2, "cpu")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One data dir for the whole session, so the digits JPEG files are written once."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def trained_on_both(tmp_path_factory, data_dir):
    """The same experiment trained by each backend from the command line (tests/support/both_backends.py), once a
    session: (its dir, (output, summary) on Lightning, (output, summary) on Keras); runs in <dir>/<backend>."""
    from tests.support.both_backends import train_on_both

    return train_on_both(tmp_path_factory.mktemp("agree"), data_dir)


@pytest.fixture(scope="session")
def detection_runs(tmp_path_factory, data_dir):
    """5 epochs of the default detection run on each backend (tests/support/both_backends.py), once a session:
    (its dir, backend -> summary); runs in <dir>/<backend>, one MLflow store <dir>/mlflow.db."""
    from tests.support.both_backends import detection_on_both

    return detection_on_both(tmp_path_factory.mktemp("detect"), data_dir)


@pytest.fixture
def digits_copy(tmp_path, data_dir) -> Path:
    """A private copy of the digits dataset that the test may damage."""
    source = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    copy = tmp_path / "damaged"
    shutil.copytree(source, copy)
    return copy


@pytest.fixture
def make_cfg(tmp_path, data_dir):
    """compose_config bound to this test's tmp dir and the session's data dir."""

    def make(*overrides: str, output_dir: Path | None = None):
        return compose_config(list(overrides), tmp_path, data_dir, output_dir)

    return make


@pytest.fixture
def bench_with(tmp_path):
    """A benchmark of this machine built from `hydrali-bench <overrides>`'s config (HydraConfig set, as at run time),
    its data under tmp_path/data."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from hydrali.bench.schema import register_bench_schema
    from hydrali.bench.sections import Bench, detect_machine
    from hydrali.core.config.store import register_schemas

    register_schemas()
    register_bench_schema()
    GlobalHydra.instance().clear()

    def make(*overrides: str):
        overrides = [f"paths.data_dir={tmp_path}/data", *overrides]
        full = compose("bench", overrides=[*overrides, f"hydra.run.dir={tmp_path}/run"], return_hydra_config=True)
        HydraConfig.instance().set_config(full)
        return Bench(compose("bench", overrides=overrides).bench, overrides, tmp_path / "run", detect_machine())

    with initialize_config_module(config_module="hydrali.conf", version_base="1.3"):
        yield make
    GlobalHydra.instance().clear()
