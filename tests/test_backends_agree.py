"""Both backends run the same experiment: the same epochs, lr at every step, params and metric names,
each loading only its own framework, each log line printed once."""

import os

import pytest
from mlflow.tracking import MlflowClient

from tests.support.cli import start_cli
from tests.support.configs import SMALL_NET

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def both(trained_on_both):
    """The same experiment run by each backend (tests/support/both_backends.py), shared with other modules."""
    return trained_on_both


def test_both_backends_take_the_same_steps_at_the_same_lr(both):
    _, (_, lightning), (_, keras) = both
    assert lightning["steps_per_epoch"] == keras["steps_per_epoch"] == 22
    for a, b in zip(lightning["history"], keras["history"], strict=True):
        assert a["train/images"] == b["train/images"] == 22 * 64
        assert a["lr/first"] == pytest.approx(b["lr/first"], rel=1e-6)
        assert a["lr/last"] == pytest.approx(b["lr/last"], rel=1e-6)
        assert a["val/images"] == b["val/images"] == 360
    assert lightning["train_images"] == keras["train_images"] == 2 * 22 * 64
    # 2 batches of 64 per optimizer step: the lr rule counts 128 images (sgd_small: 0.1 x 128 / 32), 11 steps an
    # epoch; warmup over the first epoch, then cosine: the first step runs at lr / 10, epoch 1 starts at the full lr
    assert lightning["global_batch"] == keras["global_batch"] == 128
    assert lightning["effective_lr"] == keras["effective_lr"] == pytest.approx(0.4)
    assert lightning["history"][0]["lr/first"] == pytest.approx(0.04)
    # the epoch's last batch belongs to its 11th step: warmup's lr/10 + (lr - lr/10) x 10/11
    assert lightning["history"][0]["lr/last"] == pytest.approx(0.04 + 0.36 * 10 / 11)
    assert lightning["history"][1]["lr/first"] == pytest.approx(0.4)


def test_both_backends_report_whole_run_and_steady_state_throughput(both):
    _, (lightning_out, lightning), (keras_out, keras) = both
    for out, summary in ((lightning_out, lightning), (keras_out, keras)):
        # the whole run's rate is the images trained over the seconds spent training, which are part of the wall
        # time from the command to the summary: above the rate over the wall time
        trained, seconds = summary["train_images"], summary["train_seconds"]
        assert trained == 2 * 22 * 64 and 0 < seconds < summary["wall_seconds"]
        assert summary["images_per_second"] == pytest.approx(trained / seconds, rel=1e-3)
        assert summary["images_per_second"] > trained / summary["wall_seconds"]
        assert summary["steady_images_per_second"] > 0
        line = next(line for line in out.stdout.splitlines() if line.startswith("images/s (train)"))
        assert f"{summary['steady_images_per_second']:.1f} steady state" in line
        assert any(line.endswith(": 1 x 64 x 2 = 128") for line in out.stdout.splitlines()), "the global batch"


def test_both_backends_log_the_same_params_and_metrics(both):
    tmp_path, (_, lightning), (_, keras) = both
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = {s["backend"]: client.get_run(s["mlflow_run_id"]).data for s in (lightning, keras)}
    # backend.* holds each backend's own options (devices vs replicas, ...): everything else is the same
    shared = {
        b: {k: v for k, v in d.params.items() if not k.startswith("backend.") and k != "paths.output_dir"}
        for b, d in runs.items()
    }
    assert shared["lightning"] == shared["keras"]
    assert shared["keras"]["epoch/steps_per_epoch"] == "22" and shared["keras"]["task.label_smoothing"] == "0.1"
    assert shared["keras"]["epoch/optimizer_steps_per_epoch"] == "11" and shared["keras"]["plan/accumulate"] == "2"
    trained = {b: {name for name in d.metrics if not name.startswith("eval/")} for b, d in runs.items()}  # hydrali
    #   eval (tests/test_after_training.py) adds its own to the same runs
    assert (
        trained["lightning"]
        == trained["keras"]
        == {"train/loss", "train/images", "val/loss", "val/acc", "val/images", "lr/first", "lr/last"}
    )


def test_each_backend_loads_only_its_framework_and_prints_each_line_once(both):
    _, (lightning_out, _), (keras_out, _) = both
    assert lightning_out.stdout.strip().splitlines()[-1] == "LOADED True False", "Lightning never imports tensorflow"
    assert keras_out.stdout.strip().splitlines()[-1] == "LOADED False True", "Keras never imports torch"
    for out in (lightning_out, keras_out):
        lines = [line.split("] - ", 1)[-1] for line in (out.stdout + out.stderr).splitlines() if "] - " in line]
        assert lines and len(lines) == len(set(lines)), "a log line printed twice"
    for out in (lightning_out, keras_out):
        both_streams = out.stdout + out.stderr
        assert "GPU available" not in both_streams and "oneDNN" not in both_streams, "no start-up noise"
        assert both_streams.count("model: ResNet, ") == 1


def test_both_backends_print_the_summary_table_in_one_order(both):
    _, (lightning_out, _), (keras_out, _) = both
    names = [
        [line.split(":", 1)[0].strip() for line in out.stdout.splitlines() if line.startswith("final ")]
        for out in (lightning_out, keras_out)
    ]
    assert names[0] == names[1], names  # before: final val/loss, val/acc, train/loss on Lightning, the reverse on Keras
    assert names[0][0] == "final train/loss" and names[0].index("final val/acc") < names[0].index("final lr/last")


def test_output_to_a_file_is_one_line_per_epoch_on_both_backends(both):
    _, (lightning_out, _), (keras_out, _) = both
    shown = {}
    for name, out in (("lightning", lightning_out), ("keras", keras_out)):
        text = out.stdout + out.stderr
        assert "\x1b[" not in text, f"{name}: no terminal escape codes in a file"
        epoch_lines = [line.split("] - ", 1)[1] for line in text.splitlines() if "] - epoch " in line]
        assert [line.split(":")[0] for line in epoch_lines] == ["epoch 1/2", "epoch 2/2"], text[-3000:]
        shown[name] = [[part.split(" ")[0] for part in line.split(": ", 1)[1].split(", ")] for line in epoch_lines]
        assert len(text.splitlines()) < 60, f"{name} wrote {len(text.splitlines())} lines for 2 epochs"
    assert sorted(map(sorted, shown["lightning"])) == sorted(map(sorted, shown["keras"])), "the same keys per epoch"
    for noise in ("absl::InitializeLog", "cuInit", "cudart_stub", "cpu_feature_guard"):
        assert noise not in keras_out.stderr, f"TensorFlow's start-up chatter: {noise}"


def test_lightning_shows_a_bar_on_a_terminal_counting_epochs_from_one(tmp_path, data_dir):
    import pty

    leader, follower = pty.openpty()
    proc = start_cli(
        f"paths.data_dir={data_dir}",
        "epochs=2",
        *SMALL_NET,
        "tracking=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        env={"COLUMNS": "120"},
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    screen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the run ended
            break
        if not chunk:
            break
        screen += chunk
    assert proc.wait(timeout=600) == 0, screen[-3000:]
    text = screen.decode(errors="replace")
    assert "Epoch 2/2" in text and "Epoch 1/2" in text, text[-3000:]
    assert "Epoch 0/" not in text and "Epoch 1/1" not in text


def test_both_backends_count_epochs_from_one_in_history_summary_mlflow_and_checkpoint_names(both):
    tmp_path, (_, lightning), (_, keras) = both
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    for summary, suffix in ((lightning, ".ckpt"), (keras, ".weights.h5")):
        rows = summary["history"]
        assert [row["epoch"] for row in rows] == [1, 2]
        best = max(rows, key=lambda row: (row["val/acc"], -row["epoch"]))["epoch"]
        assert summary["best_epoch"] == best
        steps = [m.step for m in client.get_metric_history(summary["mlflow_run_id"], "val/acc")]
        assert steps == [1, 2]
        assert os.path.basename(summary["best_checkpoint"]) == f"epoch{best:03d}{suffix}", summary["backend"]
        names = {p.name for p in (tmp_path / summary["backend"] / "checkpoints").iterdir()}
        assert f"epoch{best:03d}{suffix}" in names
