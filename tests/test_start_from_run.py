"""model.weights=<a hydrali run>: a new run's network starts from an earlier run's weights (not its optimizer or
epoch), with a new head when the classes differ, on each backend; what cannot start from a run is one line before
anything is written."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import yaml

from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY
from tests.support.pretrained import digits_classes

pytestmark = pytest.mark.slow  # its fixture trains a run on each backend
QUIET = {"lightning": LIGHTNING_QUIET, "keras": KERAS_QUIET}


def _train(tmp_path, backend: str, root, name: str, *extra: str, epochs: int = 1):
    run_dir = tmp_path / name
    out = run_cli(
        "data=imagefolder",
        f"data.root={root}",
        "pipeline.options.flip_probability=0",
        f"epochs={epochs}",
        f"backend={backend}",
        *TINY,
        *QUIET[backend],
        *extra,
        "tracking=none",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    return out, run_dir


@pytest.fixture(scope="module")
def digits_sets(tmp_path_factory, data_dir):
    """digits 0-4 (5 classes) and 5-7 (3 classes), as two image folders."""
    from hydrali.tasks.classification.datasets import write_digits

    digits = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    root = tmp_path_factory.mktemp("digit-sets")
    return (
        digits_classes(digits, root / "0-4", ["0", "1", "2", "3", "4"]),
        digits_classes(digits, root / "5-7", ["5", "6", "7"]),
    )


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory, digits_sets):
    """One finished run on digits 0-4 per backend, for the tests to start from (and to be refused)."""
    folder = tmp_path_factory.mktemp("first-runs")
    runs = {}
    for backend in ("lightning", "keras"):
        out, run_dir = _train(folder, backend, digits_sets[0], f"first-{backend}", epochs=2)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[backend] = run_dir
    return runs


def _lightning_network(checkpoint) -> dict[str, np.ndarray]:
    """The network's tensors (weights and BatchNorm statistics) in a hydrali Lightning checkpoint."""
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    prefix = "torch_task.model."
    return {k[len(prefix) :]: v.numpy() for k, v in state.items() if k.startswith(prefix)}


def _keras_network(checkpoint, run_dir) -> dict[str, np.ndarray]:
    """The network's variables in a hydrali Keras checkpoint, read by Keras into the network its run's config builds
    (keyed by the position of each layer holding weights)."""
    from pathlib import Path

    import keras
    from omegaconf import OmegaConf

    from hydrali.backends.keras.model import TaskModel
    from hydrali.core.config.store import register_schemas
    from hydrali.tasks.classification.keras_task import KerasClassification

    register_schemas()  # the saved config's resolvers (model.stem), whichever test ran in this process before
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    classes = len(list((Path(cfg.data.root) / "train").iterdir()))
    OmegaConf.update(cfg, "model.weights", None)
    OmegaConf.update(cfg, "model.freeze", None)
    network = KerasClassification(None).build_model(cfg.model, classes, int(cfg.data.image_size))
    holder = TaskModel(network, [1], batch=1)
    holder(keras.ops.zeros((1, *network.input_shape[1:])))
    holder.load_weights(checkpoint)
    layers = [layer for layer in network.layers if layer.weights]
    return {f"{n}/{i}": np.asarray(w) for n, layer in enumerate(layers) for i, w in enumerate(layer.weights)}


def _network_of(backend: str, run_dir, checkpoint=None) -> dict[str, np.ndarray]:
    """The network of a run's checkpoint (by default its last)."""
    if backend == "lightning":
        return _lightning_network(checkpoint or run_dir / "checkpoints" / "last.ckpt")
    return _keras_network(checkpoint or sorted((run_dir / "checkpoints").glob("epoch*.weights.h5"))[-1], run_dir)


@pytest.mark.slow
@pytest.mark.keras
@pytest.mark.parametrize("backend", ["lightning", "keras"])
def test_a_run_starts_from_an_earlier_runs_network_with_a_new_head_for_its_classes(
    tmp_path, digits_sets, first_runs, backend
):
    """Digits 5-7 from the network of a run on digits 0-4, its backbone frozen: after an epoch the backbone (weights
    and BatchNorm statistics) is exactly the earlier run's, the head is new for 3 classes, and the run counts its
    own epochs from 1."""
    earlier = first_runs[backend]
    out, run_dir = _train(
        tmp_path, backend, digits_sets[1], "second", f"model.weights={earlier}", "model.freeze=backbone"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    started = re.search(
        r"model.weights: the network starts from (\S+) \(a new head: 5 classes there\)", out.stderr + out.stdout
    )
    assert started, out.stderr[-3000:]
    assert started.group(1) == read_summary(earlier)["best_checkpoint"]  # the earlier run's best
    then, now = _network_of(backend, earlier, started.group(1)), _network_of(backend, run_dir)
    assert then.keys() == now.keys()
    differ = sorted(k for k in now if then[k].shape != now[k].shape)
    same = [k for k in now if k not in differ]
    assert differ and all(3 in now[k].shape and 5 in then[k].shape for k in differ if now[k].ndim), differ
    assert all(np.array_equal(then[k], now[k]) for k in same), [k for k in same if not np.array_equal(then[k], now[k])]
    assert [row["epoch"] for row in read_summary(run_dir)["history"]] == [1]


def test_a_checkpoint_file_of_a_run_starts_the_network_as_its_run_dir_does(tmp_path, digits_sets, first_runs):
    """model.weights=<a checkpoint in a run's checkpoints/>: the same classes, so the head is taken too."""
    checkpoint = first_runs["lightning"] / "checkpoints" / "last.ckpt"
    out, run_dir = _train(tmp_path, "lightning", digits_sets[0], "again", f"model.weights={checkpoint}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"the network starts from {checkpoint} (its head too)" in out.stderr + out.stdout
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert config["model"]["weights"] == str(checkpoint)


def test_a_run_started_from_a_run_named_relative_to_the_working_dir_resumes(tmp_path, digits_sets, first_runs):
    """Its model.weights recorded as typed, pinned absolute on resume: ckpt_path=last trains on from its own
    checkpoint."""
    relative = os.path.relpath(first_runs["lightning"], tmp_path)
    out, run_dir = _train(tmp_path, "lightning", digits_sets[1], "second", f"model.weights={relative}")
    assert out.returncode == 0, out.stderr[-3000:]
    out, _ = _train(
        tmp_path, "lightning", digits_sets[1], "second", f"model.weights={relative}", "ckpt_path=last", epochs=2
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert [row["epoch"] for row in read_summary(run_dir)["history"]] == [1, 2]


def test_a_run_at_another_image_size_takes_the_network_settings_of_the_run_it_starts_from(
    tmp_path, digits_sets, first_runs
):
    """model.weights=<a 16 px run> at data.image_size=72: the default network's layout, which the image size chooses
    (ResNet-18-D above 64 px), is that run's (small_resnet's: one block a stage, small stem, conv shortcuts), so its
    weights load; the run records the stem it trained, and eval of it scores its network at 72 px. The same with
    model.stem=imagenet on the command line is refused, naming it."""
    earlier = first_runs["lightning"]
    out, run_dir = _train(
        tmp_path, "lightning", digits_sets[0], "larger", f"model.weights={earlier}", "data.image_size=72"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    taken = (out.stderr + out.stdout).split("that run's network settings, where the command line sets none: ")[1]
    assert all(
        f"model.{setting}" in taken.splitlines()[0] for setting in ("layers=[1, 1, 1]", "stem=small", "shortcut=conv")
    )
    assert json.loads((run_dir / "run.json").read_text())["config"]["model"]["stem"] == "small"
    then, now = (
        _network_of("lightning", earlier, read_summary(earlier)["best_checkpoint"]),
        _network_of("lightning", run_dir),
    )
    assert then.keys() == now.keys() and all(then[k].shape == now[k].shape for k in then)
    scored = run_cli("eval", str(run_dir), "tracking=none", cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr[-3000:]
    out, refused = _train(
        tmp_path,
        "lightning",
        digits_sets[0],
        "set",
        f"model.weights={earlier}",
        "data.image_size=72",
        "model.stem=imagenet",
    )
    fails_with(out, "trained another network", "stem is 'small' there, 'imagenet' here")
    assert not refused.exists()
    named = ("model=small_resnet", "data.image_size=72")  # a network named on the command line is taken as named
    out, refused = _train(tmp_path, "lightning", digits_sets[0], "named", f"model.weights={earlier}", *named)
    fails_with(out, "trained another network", "stem is 'small' there, 'imagenet' here")
    assert not refused.exists()


REFUSALS = {  # what is asked on top of model.weights=<the Lightning run on digits 0-4>, and the line's words
    "another backend": ("keras", [], ["is a run of backend=lightning", "pass backend=lightning"]),
    "another network": ("lightning", ["model.widths=[8,16,64]"], ["trained another network", "[8, 16, 32] there"]),
}


@pytest.mark.parametrize("refused", REFUSALS, ids=list(REFUSALS))
def test_what_cannot_start_from_a_run_is_one_line_and_writes_nothing(tmp_path, digits_sets, first_runs, refused):
    backend, extra, needles = REFUSALS[refused]
    earlier = first_runs["lightning"]
    before = {p: p.stat().st_mtime_ns for p in earlier.rglob("*")}
    out, run_dir = _train(tmp_path, backend, digits_sets[1], "refused", f"model.weights={earlier}", *extra)
    fails_with(out, *needles)
    assert not run_dir.exists()
    assert {p: p.stat().st_mtime_ns for p in earlier.rglob("*")} == before


def test_a_run_of_another_model_is_one_line_naming_both_builders(tmp_path, digits_sets, first_runs):
    """model=timm from a run of small_resnet: its settings are not mixed in; one line names both networks' code."""
    run_dir = tmp_path / "timm"
    out = run_cli(
        "data=imagefolder",
        f"data.root={digits_sets[1]}",
        "model=timm",
        "model.name=resnet18",
        f"model.weights={first_runs['lightning']}",
        "tracking=none",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    fails_with(out, "is a run of another model", "torch_model.ResNet' there", "timm_model.TimmNetwork' here", "model=")
    assert not run_dir.exists()


def test_a_task_that_cannot_tell_backbone_from_head_refuses_a_runs_weights(tmp_path, first_runs):
    run_dir = tmp_path / "detection"
    out = run_cli(
        "task=detection", f"model.weights={first_runs['lightning']}", f"hydra.run.dir={run_dir}", cwd=tmp_path
    )
    fails_with(out, f"model.weights={first_runs['lightning']} is not there yet for task=detection")
    assert not run_dir.exists()


def test_a_file_that_is_no_run_for_a_model_that_reads_none_is_one_line(tmp_path, digits_sets):
    stray = tmp_path / "weights.pth"
    stray.write_bytes(b"not a run")
    out, run_dir = _train(tmp_path, "lightning", digits_sets[1], "refused", f"model.weights={stray}")
    fails_with(out, f"model.weights={stray} is not a hydrali run", "model=timm also reads")
    assert not run_dir.exists()
    out, _ = _train(tmp_path, "lightning", digits_sets[1], "refused", f"model.weights={tmp_path / 'nowhere'}")
    fails_with(out, "no such file or directory")
