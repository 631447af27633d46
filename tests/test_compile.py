"""backend.compile=true: torch.compile on Lightning, XLA on Keras; checkpoints unaffected; the first step apart."""

import json

import pytest
import torch

from hydrali.core.run.runner import run
from hydrali.core.run.summary import format_table
from tests.support.checks import read_summary
from tests.support.cli import run_cli
from tests.support.configs import LIGHTNING_QUIET, SMALL_NET, with_plugin_callback

pytestmark = pytest.mark.slow
# 3 batches of 120 score the 360 validation images: one shape for every step, so one graph per mode (train, eval).
# The network without BatchNorm compiles in half the time of the small ResNet (inductor builds C++ kernels on a CPU)
# and is an nn.Sequential, which nn.Module.compile would leave uncompiled (hydrali compiles its forward).
TINY = [
    *SMALL_NET,
    "pipeline=light",
    "data.batch_size=120",
    "tracking=none",
    "data.verify=off",
    "model._target_=tests.support.plugins.torch_model_without_batchnorm",
    "model.keras_target=tests.support.plugins.keras_model_without_batchnorm",
]


def _checkpoint_keys(path) -> list[str]:
    return list(torch.load(path, map_location="cpu", weights_only=True)["state_dict"])


def test_lightning_compiled_checkpoint_resumes_uncompiled_and_back(make_cfg, tmp_path):
    out, graphs = tmp_path / "run", tmp_path / "graphs.json"
    observe = with_plugin_callback("graphs", "RecordDynamoGraphs", path=str(graphs))
    run(make_cfg(*TINY, "epochs=1", "backend.compile=true", observe, output_dir=out))
    assert json.loads(graphs.read_text())["graphs"] >= 2, "TorchDynamo compiled the training and eval graphs"
    compiled = read_summary(out)
    assert compiled["compiled"] is True and compiled["first_step_seconds"] > 0
    assert compiled["history"][0]["val/images"] == 360
    assert "first step" in format_table(compiled) and "compile warm-up" in format_table(compiled)
    compiled_keys = _checkpoint_keys(out / "checkpoints" / "last.ckpt")
    assert not any("_orig_mod" in key for key in compiled_keys)

    run(make_cfg(*TINY, "epochs=2", "ckpt_path=last", "backend.compile=false", output_dir=out))
    eager = read_summary(out)
    assert (eager["first_epoch"], eager["epochs"], eager["compiled"]) == (2, 2, False)
    assert eager["first_step_seconds"] > 0
    assert _checkpoint_keys(out / "checkpoints" / "last.ckpt") == compiled_keys, "the same keys either way"

    run(make_cfg(*TINY, "epochs=3", "ckpt_path=last", "backend.compile=true", output_dir=out))
    again = read_summary(out)
    assert (again["first_epoch"], again["epochs"], again["compiled"]) == (3, 3, True)
    assert [row["epoch"] for row in again["history"]] == [1, 2, 3]


@pytest.mark.keras
def test_keras_compile_trains_with_xla(make_cfg, tmp_path):
    out, jit, traces = tmp_path / "keras", tmp_path / "jit.json", tmp_path / "traces.jsonl"
    observe = with_plugin_callback("jit", "KerasRecordJit", path=str(jit))
    record = f"+model.record_xla={traces}"
    run(
        make_cfg(
            *TINY,
            "backend=keras",
            "progress_bar=false",
            "epochs=1",
            "backend.compile=true",
            observe,
            record,
            output_dir=out,
        )
    )
    assert json.loads(jit.read_text()) == {"jit_compile": True, "train_function": True}
    traced = [json.loads(line) for line in traces.read_text().splitlines()]
    assert {(t["training"], t["xla"]) for t in traced} == {(True, True), (False, True)}, (
        f"the network's forward was traced inside XLA for training and for validation, never outside: {traced}"
    )
    summary = read_summary(out)
    assert summary["compiled"] is True and summary["first_step_seconds"] > 0
    assert summary["history"][0]["train/images"] == 11 * 120 and summary["history"][0]["val/images"] == 360


def test_a_later_lightning_run_at_another_lr_reads_the_compiled_graphs_kept(tmp_path, data_dir):
    """backend.compile_cache: torch.compile's graphs kept under paths.cache_dir by one run are read by a later run in
    another process (as a sweep's next job, at another lr) instead of compiled again (torch's own cache counters)."""

    def compiled_run(name: str, lr: str) -> dict:
        counts = tmp_path / f"{name}.json"
        out = run_cli(
            *TINY,
            "epochs=1",
            "backend.compile=true",
            f"optim.lr={lr}",
            *LIGHTNING_QUIET,
            with_plugin_callback("graphs", "RecordDynamoGraphs", path=str(counts)),
            f"paths.root={tmp_path}",
            f"paths.data_dir={data_dir}",
            f"hydra.run.dir={tmp_path / name}",
            cwd=tmp_path,
            unset=("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"),
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(counts.read_text())

    first = compiled_run("first", "0.1")
    assert first["graphs"] >= 2 and first["fxgraph_cache_miss"] >= 2 and first["fxgraph_cache_hit"] == 0, first
    kept = tmp_path / ".hydrali_cache" / "torch"
    assert any(kept.rglob("*.py")), "Inductor's generated code is kept under paths.cache_dir"

    other_lr = compiled_run("other-lr", "0.3")
    assert other_lr["graphs"] == first["graphs"]
    assert other_lr["fxgraph_cache_miss"] == 0 and other_lr["autograd_cache_miss"] == 0, other_lr
    assert other_lr["fxgraph_cache_hit"] + other_lr["autograd_cache_hit"] >= first["graphs"], other_lr
