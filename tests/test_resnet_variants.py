"""The ResNets' ResNet-C/D variants (model.stem=deep, model.shortcut=avgpool; He et al. 2019, "Bag of Tricks"): on
torch the very network timm builds as resnet18d / resnet50d (timm's weights give timm's outputs), on Keras the same
layers (the same weights' shapes, in the same order); a run of either backend trains them; keras.applications'
ResNet-50 refuses a variant it does not build; a run recorded before model.shortcut existed is still resumed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch

from hydrali.core.run.runner import run
from hydrali.tasks.classification.torch_model import ResNet
from tests.support.checks import read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, TINY, compose_config

LAYOUTS = {  # timm's name -> hydrali's ResNet arguments for it
    "resnet18d": {"block": "basic", "layers": (2, 2, 2, 2)},
    "resnet50d": {"block": "bottleneck", "layers": (3, 4, 6, 3)},
}
VARIANT = {"stem": "deep", "shortcut": "avgpool"}


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_deep_stem_and_pooled_shortcuts_are_timms_resnet_d(name):
    torch.manual_seed(0)
    reference = timm.create_model(name, num_classes=10).eval()
    ours = ResNet(10, **LAYOUTS[name], **VARIANT).eval()
    theirs = list(reference.state_dict().values())
    mine = ours.state_dict()
    assert [tuple(t.shape) for t in theirs] == [tuple(t.shape) for t in mine.values()], "the same tensors, in order"
    ours.load_state_dict(dict(zip(mine, theirs)))
    images = torch.randn(2, 3, 160, 160)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), reference(images), rtol=1e-4, atol=1e-4)
    plain = ResNet(10, **LAYOUTS[name])
    assert sum(p.numel() for p in plain.parameters()) < sum(p.numel() for p in ours.parameters())


@pytest.mark.keras
@pytest.mark.parametrize("name", LAYOUTS)
def test_keras_builds_the_same_layers_as_torch(name):
    from hydrali.tasks.classification.keras_model import ResNet as KerasResNet

    keras_net = KerasResNet(10, 64, **LAYOUTS[name], **VARIANT)
    torch_net = ResNet(10, **LAYOUTS[name], **VARIANT)
    # torch's convolution kernels (out, in, h, w), Keras' (h, w, in, out), in the order the layers are built
    torch_kernels = [tuple(t.shape) for n, t in torch_net.state_dict().items() if t.ndim == 4]
    keras_kernels = [(s[3], s[2], s[0], s[1]) for s in (tuple(w.shape) for w in keras_net.weights) if len(s) == 4]
    assert keras_kernels == torch_kernels
    assert keras_net.count_params() - sum(t.numel() for n, t in torch_net.named_buffers() if "running" in n) == sum(
        p.numel() for p in torch_net.parameters()
    )


@pytest.mark.keras
def test_keras_applications_resnet50_refuses_a_variant_it_does_not_build(tmp_path, data_dir):
    from hydrali.core.errors import HydraliError

    overrides = ["backend=keras", "model=resnet50", "model.stem=deep", "data.image_size=32", "epochs=1"]
    run_dir = tmp_path / "run"
    with pytest.raises(HydraliError, match=r"model.keras_target=hydrali.tasks.classification.keras_model.ResNet"):
        run(compose_config([*overrides, "tracking=none", *KERAS_QUIET], tmp_path, data_dir, run_dir))
    assert not run_dir.exists(), "refused before the run dir is touched"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])
def test_a_run_trains_the_variant_and_one_recorded_before_model_shortcut_resumes_and_gives_its_weights(
    tmp_path, data_dir, backend
):
    quiet = LIGHTNING_QUIET if backend == "lightning" else KERAS_QUIET
    overrides = [f"backend={backend}", "tracking=none", *TINY, *quiet, "model.stem=deep", "model.shortcut=avgpool"]
    run_dir = tmp_path / "run"
    run(compose_config([*overrides, "epochs=1"], tmp_path, data_dir, run_dir))
    assert np.isfinite(read_summary(run_dir)["final"]["train/loss"])

    plain = [f"backend={backend}", "tracking=none", *TINY, *quiet]
    old = tmp_path / "old"
    run(compose_config([*plain, "epochs=1"], tmp_path, data_dir, old))
    for record in (old / "run.json", old / "checkpoints" / "trained_with.json"):  # as an earlier release wrote them
        written = json.loads(record.read_text())
        model = written["config"]["model"] if "config" in written else written["model"]
        del model["shortcut"]
        record.write_text(json.dumps(written))
    run(compose_config([*plain, "epochs=2", "ckpt_path=last"], tmp_path, data_dir, old))
    assert [row["epoch"] for row in read_summary(old)["history"]] == [1, 2]
    run(compose_config([*plain, "epochs=1", f"model.weights={old}"], tmp_path, data_dir, tmp_path / "from_old"))
    assert read_summary(tmp_path / "from_old")["history"], "a network started from the old run's weights trained"
    scored = run_cli("eval", str(old), "model.shortcut=conv", f"paths.data_dir={data_dir}", cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr[-3000:]  # the value it trained with: allowed
