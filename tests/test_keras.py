"""The Keras backend: the same tasks, recipes, plan and tracking as Lightning, on MirroredStrategy."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from hydrali.core.run.runner import run
from tests.support.checks import (
    check_each_val_image_counted_once,
    check_resume_keeps_the_record,
    check_validation_every_second_epoch,
    fails_with,
    read_summary,
)
from tests.support.cli import cli_env, run_cli
from tests.support.configs import KERAS_QUIET, SMALL_NET, TINY, compose_config, with_plugin_callback
from tests.support.datasets import write_one_image_per_class
from tests.support.plugins import keras_model_without_batchnorm

pytestmark = [pytest.mark.slow, pytest.mark.keras]
QUIET = ["backend=keras", *KERAS_QUIET]


@pytest.fixture(scope="module")
def keras_run(tmp_path_factory, data_dir):
    """The default experiment on Keras, shortened to 6 epochs, tracked in MLflow."""
    root = tmp_path_factory.mktemp("keras")
    cfg = compose_config(["epochs=6", *QUIET], root, data_dir)
    run(cfg)
    return cfg, read_summary(cfg.paths.output_dir)


def test_keras_learns_digits(keras_run):
    cfg, summary = keras_run
    assert summary["backend"] == "keras"
    assert summary["best"]["val/acc"] >= 0.8
    assert summary["history"][-1]["train/loss"] < summary["history"][0]["train/loss"]
    best_epochs = max(summary["history"], key=lambda r: r["val/acc"])["epoch"]
    assert summary["best_checkpoint"].endswith(f"epoch{best_epochs:03d}.weights.h5")
    kept = {p.name for p in (Path(cfg.paths.output_dir) / "checkpoints").glob("*.h5")}
    assert kept == {f"epoch{n:03d}.weights.h5" for n in {6, best_epochs}}, "keep_checkpoints=1: the newest and the best"


def test_keras_trains_whole_batches_and_scores_each_val_image_once(keras_run):
    _, summary = keras_run
    assert summary["steps_per_epoch"] == 22  # as on Lightning: 1437 images, 22 whole batches of 64
    assert [row["train/images"] for row in summary["history"]] == [22 * 64] * 6
    check_each_val_image_counted_once(summary)


def test_two_replicas_show_in_mlflow_and_summary_and_read_disjoint_shards(make_cfg, tmp_path, monkeypatch):
    from tests.support.keras_plugins import RECORD_ENV, read_record

    # every image its own class: the labels the loss saw name the files DALI read for each replica
    classes, batch = 36, 8  # shards of 18: 2 whole training batches, 3 validation batches (the last holds 2)
    write_one_image_per_class(tmp_path / "ds", classes)
    record = tmp_path / "labels.txt"
    monkeypatch.setenv(RECORD_ENV, str(record))
    cfg = make_cfg(
        "epochs=1",
        "backend.devices=2",
        "data=imagefolder",
        f"data.root={tmp_path / 'ds'}",
        f"data.batch_size={batch}",
        *TINY,
        "pipeline.options.initial_fill=1",  # no draw from the next pass
        "task.sides.keras=tests.support.keras_plugins.recording_classification",
        *QUIET,
    )
    run(cfg)
    summary = read_summary(cfg.paths.output_dir)
    assert (summary["world_size"], summary["per_replica_batch"], summary["global_batch"]) == (2, batch, 2 * batch)
    params = MlflowClient(cfg.tracking.uri).get_run(summary["mlflow_run_id"]).data.params
    assert (params["plan/world_size"], params["plan/global_batch"]) == ("2", str(2 * batch))
    check_each_val_image_counted_once(summary, val_set=classes)
    assert summary["history"][0]["train/images"] == 2 * 2 * batch
    _, batches = read_record(record)
    labels = [label for labels in batches for label in labels]
    assert len(batches) == 2 * 2 and all(len(labels) == batch for labels in batches), "2 steps x 2 replicas"
    assert len(set(labels)) == len(labels) == 2 * 2 * batch, "the replicas read disjoint shards, each image once"


@pytest.mark.parametrize("jit_compile", [False, True], ids=["eager", "xla"])
def test_one_sgd_step_on_two_replicas_or_of_two_accumulated_batches_equals_one_step_with_twice_the_batch(
    make_cfg, jit_compile
):
    import keras
    import tensorflow as tf

    from hydrali.backends.keras.compiled import compile_model
    from hydrali.backends.keras.data import distribute
    from hydrali.backends.keras.strategy import configure_devices, make_strategy
    from hydrali.core.distributed.topology import detect_topology
    from hydrali.core.run.epoch import make_epoch_steps
    from hydrali.core.run.plan import make_plan
    from hydrali.tasks.classification.keras_task import KerasClassification

    cfg = make_cfg("backend=keras", "optim.warmup_epochs=0")
    half, size, classes = 8, 16, 10
    rng = np.random.default_rng(0)
    images = rng.normal(size=(2 * half, size, size, 3)).astype("float32")
    labels = rng.integers(0, classes, size=(2 * half, 1)).astype("int32")

    def one_step(replicas: int, accumulate: int = 1):
        batch = 2 * half // replicas // accumulate
        plan = make_plan(
            topology=detect_topology(replicas, 1, env={}, replicas_per_process=replicas),
            batch_size=batch,
            base_lr=cfg.optim.lr,
            ref_batch=cfg.optim.ref_batch,
            rule=str(cfg.optim.scale),
            warmup_epochs=0,
            epochs=1,
            seed=0,
            device="cpu",
            accumulate=accumulate,
        )
        devices = configure_devices(replicas, "cpu")
        strategy = make_strategy(devices)
        keras.utils.set_random_seed(0)
        side = KerasClassification(cfg.task)
        contract = make_epoch_steps(
            train_samples=2 * half,
            val_samples=2 * half,
            num_shards=replicas,
            batch=batch,
            last_batch="drop",
            accumulate=accumulate,
        )
        assert contract.optimizer_steps == 1
        model = compile_model(
            strategy=strategy,
            build_network=lambda: keras_model_without_batchnorm(classes, size),
            loss=side.loss(),
            metrics=side.metrics(),
            optim=cfg.optim,
            plan=plan,
            contract=contract,
            jit_compile=jit_compile,
        )
        assert model.jit_compile == jit_compile
        before = [keras.ops.convert_to_numpy(w) for w in model.weights]
        shard = 2 * half // replicas  # replica i's images, in `accumulate` batches
        data = distribute(
            strategy,
            devices,
            "cpu",
            lambda i: tf.data.Dataset.from_tensor_slices(
                (
                    images[i * shard : (i + 1) * shard].reshape(accumulate, batch, size, size, 3),
                    labels[i * shard : (i + 1) * shard].reshape(accumulate, batch, 1),
                )
            ).repeat(),
        )
        model.fit(data, epochs=1, steps_per_epoch=contract.train_steps, verbose=0, shuffle=False)
        return plan, before, [keras.ops.convert_to_numpy(w) for w in model.weights]

    plan1, init1, one = one_step(1)
    assert any(not np.allclose(a, b) for a, b in zip(init1, one)), "the step changed the weights"
    for plan, init, other in (one_step(2), one_step(1, accumulate=2)):
        assert plan.global_batch == plan1.global_batch == 2 * half
        assert plan.effective_lr == plan1.effective_lr
        for a, b in zip(init1, init):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(one, other):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_keras_trains_with_xla_on_two_replicas(make_cfg, tmp_path):
    """backend.compile=true on 2 replicas (logical CPUs here, GPUs on a machine with several): Keras alone would
    XLA-compile the step over both replicas and fail to reach the second one's variables."""
    # the narrow network: what is checked is the compiled step over two replicas, not what the network learns
    cfg = make_cfg("epochs=2", "backend.devices=2", "backend.compile=true", *SMALL_NET, *QUIET)
    run(cfg)
    summary = read_summary(cfg.paths.output_dir)
    assert (summary["world_size"], summary["compiled"]) == (2, True)
    losses = [row["train/loss"] for row in summary["history"]]
    assert losses[1] < losses[0] and np.isfinite(summary["final"]["val/loss"])
    check_each_val_image_counted_once(summary)


def test_the_same_seed_gives_the_same_losses_on_keras(make_cfg, tmp_path):
    def losses(name):
        out = tmp_path / name
        run(make_cfg("seed=5", "epochs=2", "tracking=none", *SMALL_NET, *QUIET, output_dir=out))
        return [row["train/loss"] for row in read_summary(out)["history"]]

    first, again = losses("a"), losses("b")
    assert len(first) == 2 and first == again


def test_an_interrupted_keras_run_resumes_with_its_whole_record(make_cfg, tmp_path):
    # keep only the newest checkpoint: the best one (epoch 1) survives only because the run record names it
    resumed = check_resume_keeps_the_record(
        make_cfg, tmp_path, [*QUIET, "keep_checkpoints=1"], "tests.support.plugins.KerasInterruptAtEpoch"
    )
    kept = {p.name for p in (tmp_path / "resumed" / "checkpoints").glob("*.h5")}
    assert kept == {"epoch001.weights.h5", "epoch003.weights.h5"}
    assert resumed["best_checkpoint"].endswith("epoch001.weights.h5")


def test_keras_epochs_without_validation_have_no_val_metrics(make_cfg, tmp_path):
    check_validation_every_second_epoch(make_cfg, tmp_path, [*QUIET, "validate_every=2"])


BF16_RUN = ["epochs=1", "tracking=none", "backend.precision=bf16-mixed", *TINY, *QUIET]
ONE_BF16_CONVOLUTION = (
    "import tensorflow as tf; x = tf.ones((1, 8, 8, 2), tf.bfloat16); "
    "print(tf.nn.conv2d(x, x[0, :3, :3, :, None], 1, 'SAME').numpy().sum())"
)


def test_keras_trains_in_bf16_mixed_precision_on_the_cpu(data_dir, tmp_path):
    """With oneDNN free to use the CPU's kernels (ONEDNN_MAX_CPU_ISA unset, whatever the caller set)."""
    policies = tmp_path / "policies.json"
    record = with_plugin_callback("policies", "KerasRecordPolicies", path=str(policies))
    # a narrow network on 16 x 16 images: bf16 matmuls are slow on a CPU, and the policy is what is checked
    bf16 = tmp_path / "bf16"
    args = [*BF16_RUN, record, f"paths.data_dir={data_dir}", f"hydra.run.dir={bf16}"]
    out = run_cli(*args, cwd=tmp_path, unset=("ONEDNN_MAX_CPU_ISA",))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = read_summary(bf16)
    assert json.loads(policies.read_text()) == ["mixed_bfloat16"]
    assert np.isfinite(summary["final"]["train/loss"]) and summary["val_images"] == 360


def test_bf16_on_a_cpu_whose_onednn_is_held_to_avx2_trains_where_tensorflow_can_and_is_refused_where_it_cannot(
    data_dir, tmp_path
):
    """ONEDNN_MAX_CPU_ISA=AVX2 with oneDNN on: on a CPU with AVX-512, TensorFlow hands bfloat16 convolutions to
    oneDNN, which then has no kernel for them; on an AVX2 CPU TensorFlow runs them itself. hydrali's answer agrees
    with what TensorFlow does with one convolution: trains, or one line naming the fix, exit 2, no run dir."""
    held = {"ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    tensorflow = subprocess.run(
        [sys.executable, "-c", ONE_BF16_CONVOLUTION], env=cli_env(held), capture_output=True, text=True, timeout=300
    )
    run = tmp_path / "run"
    out = run_cli(*BF16_RUN, f"paths.data_dir={data_dir}", f"hydra.run.dir={run}", cwd=tmp_path, env=held)
    if tensorflow.returncode == 0:  # an AVX2 CPU: TensorFlow's own bfloat16 kernels
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert np.isfinite(read_summary(run)["final"]["train/loss"])
        return
    assert "primitive descriptor" in tensorflow.stderr, tensorflow.stderr[-2000:]
    fails_with(out, "backend.precision=32-true", "ONEDNN_MAX_CPU_ISA=AVX2", "TF_ENABLE_ONEDNN_OPTS=0")
    assert not run.exists()
