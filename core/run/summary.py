"""The end of a run: summary.json in the output dir and a table on the console."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from hydrali.core.files import write_atomically
from hydrali.core.run.plan import Plan
from hydrali.core.run.record import RunRecord
from hydrali.core.run.results import FitResult
from hydrali.core.run.wall_time import WallParts

SUMMARY_FILE = "summary.json"  # in the run dir: the finished run in numbers
SECONDS_DIGITS = 3  # the decimals of the summary's seconds
# how the table names each part of the wall time (core/run/wall_time.py), in their order
WALL_PART_LABELS = {
    "startup_s": "start-up",
    "data_check_s": "data check",
    "build_s": "build",
    "first_step_s": "first step",
    "training_s": "training",
    "validation_s": "validation",
    "tracking_s": "tracking",
    "other_s": "other",
}


def build_summary(
    *,
    result: FitResult,
    record: RunRecord,
    plan: Plan,
    monitor: str,
    mode: str,
    wall_seconds: float,
    wall_parts: WallParts | None = None,
    run_id: str | None,
    tracking_uri: str | None,
    output_dir: Path,
    task: str,
    backend: str,
) -> dict:
    """The summary of a finished run, as written to summary.json, from the whole run record (resumed epochs too);
    `wall_parts`: where this invocation's wall time went (core/run/wall_time.py), kept as "wall_parts"."""
    rows = record.rows
    # the last epoch's own metrics, in one order on every backend (each logs them in its own)
    final = metric_order({k: v for k, v in (rows[-1] if rows else {}).items() if k != "epoch"})
    best = record.best(monitor, mode)
    val_images = record.final("val/images")
    # throughput of this invocation: the images of the epochs it trained (the record counts them) over their time
    trained_now = sum(row.get("train/images", 0) for row in rows if row["epoch"] > result.first_epoch)
    images_per_second = trained_now / result.train_seconds if result.train_seconds > 0 else 0.0
    return {
        "task": task,
        "backend": backend,
        "epochs": result.epochs_completed,
        "first_epoch": result.first_epoch + 1,  # the first epoch this invocation trained, counted from 1
        "monitor": monitor,
        "best": {monitor: best[monitor] if best else None},
        "best_epoch": best["epoch"] if best else None,
        "final": final,
        "history": rows,
        "steps_per_epoch": plan.epoch.train_steps,
        "train_images": int(sum(row.get("train/images", 0) for row in rows)),
        "val_images": int(val_images) if val_images is not None else 0,  # scored by the last validation
        "wall_seconds": round(wall_seconds, SECONDS_DIGITS),
        **({"wall_parts": wall_parts.as_dict(SECONDS_DIGITS)} if wall_parts is not None else {}),
        "train_seconds": round(result.train_seconds, SECONDS_DIGITS),
        "images_per_second": round(images_per_second, 1),
        "steady_images_per_second": (
            round(result.steady_images_per_second, 1) if result.steady_images_per_second is not None else None
        ),
        "first_step_seconds": (round(result.first_step_seconds, 3) if result.first_step_seconds is not None else None),
        "compiled": result.compiled,
        "world_size": plan.world_size,
        "per_replica_batch": plan.per_replica_batch,
        "global_batch": plan.global_batch,
        "accumulate": plan.accumulate,
        "effective_lr": plan.effective_lr,
        "seed": plan.seed,
        "device": plan.device,
        "best_checkpoint": result.best_checkpoint,
        # the epoch best_checkpoint holds: the best epoch's when it was checkpointed, else the best of those kept
        "best_checkpoint_epoch": result.best_checkpoint_epoch,
        "mlflow_run_id": run_id,
        "mlflow_uri": tracking_uri,
        "output_dir": str(output_dir),
    }


METRIC_GROUPS = ("train/", "val/", "lr/")  # the order of a summary's metrics: training, validation, lr, then others


def metric_order(metrics: dict) -> dict:
    """`metrics` in the summary's order: by METRIC_GROUPS, then by name."""

    def place(name: str) -> tuple[int, str]:
        group = next((i for i, prefix in enumerate(METRIC_GROUPS) if name.startswith(prefix)), len(METRIC_GROUPS))
        return group, name

    return {name: metrics[name] for name in sorted(metrics, key=place)}


def write_summary(summary: dict, output_dir: Path) -> Path:
    """Write summary.json into the run's output dir and return its path (atomically: a run killed meanwhile leaves
    the previous one or none, never a part of one, which the same command started again would misread)."""
    return write_atomically(Path(output_dir) / SUMMARY_FILE, (json.dumps(summary, indent=2) + "\n").encode())


def best_checkpoint_line(summary: dict) -> str:
    """Which epoch the run's best checkpoint holds, and whether it is the best epoch (one not checkpointed, with
    checkpoint_every above 1, leaves the best of the checkpoints kept)."""
    name = Path(summary["best_checkpoint"]).name
    held, best = summary.get("best_checkpoint_epoch"), summary.get("best_epoch")
    if held is None or best is None:
        return name if held is None else f"{name} (epoch {held})"
    if held == best:
        return f"{name} (epoch {held}, the best)"
    return f"{name} (epoch {held}: epoch {best}, the best, was not checkpointed; see checkpoint_every)"


def format_table(summary: dict) -> str:
    """The end-of-run table shown on the console."""
    best = summary["best"][summary["monitor"]]
    rows = [
        ("task / backend", f"{summary['task']} / {summary['backend']} ({summary['device']})"),
        ("epochs", str(summary["epochs"])),
        (f"best {summary['monitor']}", "n/a" if best is None else f"{best:.4f}"),
        *([("best checkpoint", best_checkpoint_line(summary))] if summary.get("best_checkpoint") else []),
        *((f"final {k}", f"{v:.4g}") for k, v in summary["final"].items() if not k.endswith("/images")),
        (
            "images per epoch",
            f"{summary['history'][-1].get('train/images', 0):.0f} trained, {summary['val_images']} scored"
            if summary["history"]
            else "n/a",
        ),
        ("wall time", _wall_time(summary)),
        (
            "images/s (train)",
            f"{summary['images_per_second']:.1f} whole run, "
            + (
                f"{summary['steady_images_per_second']:.1f} steady state"
                if summary["steady_images_per_second"] is not None
                else "steady state n/a"
            ),
        ),
        *(
            [
                (
                    "first step",
                    f"{summary['first_step_seconds']:.2f} s"
                    + (" (compile warm-up included)" if summary.get("compiled") else ""),
                )
            ]
            if summary.get("first_step_seconds") is not None
            else []
        ),
        ("steps per epoch", str(summary["steps_per_epoch"])),
        _batch_row(summary),
        ("effective lr", f"{summary['effective_lr']:.6g}"),
        ("MLflow run id", summary["mlflow_run_id"] or "(tracking off)"),
        ("output dir", summary["output_dir"]),
    ]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 3 + max(len(v) for _, v in rows))
    body = "\n".join(f"{k.ljust(width)} : {v}" for k, v in rows)
    return f"{line}\nhydrali run summary\n{line}\n{body}\n{line}"


def read_summary(output_dir: Path) -> dict:
    """The summary.json a run wrote into `output_dir`."""
    return json.loads((Path(output_dir) / SUMMARY_FILE).read_text())


def network_name(model: DictConfig) -> str:
    """The name a run's network goes by in the log: its builder's (model._target_), the same on every backend."""
    return str(model.get("_target_", "model")).rsplit(".", 1)[-1]


def model_line(network: str, trainable: int) -> str:
    """The log's line on the network a run trains, the same on every backend: `model: ResNet, 11.2 M trainable
    parameters` (the weights a step updates: BatchNorm's running statistics are not counted, as torch does not)."""
    return f"model: {network}, {_count(trainable)} trainable parameters"


def _count(n: int) -> str:
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def _wall_time(summary: dict) -> str:
    """The wall time, and the parts it went to where the summary holds them: `41.2 s = 3.1 start-up + ...`."""
    total = f"{summary['wall_seconds']:.1f} s"
    parts = summary.get("wall_parts")  # absent from summaries written before it existed
    if not parts:
        return total
    return f"{total} = " + " + ".join(f"{parts[key]:.1f} {label}" for key, label in WALL_PART_LABELS.items())


def _batch_row(summary: dict) -> tuple[str, str]:
    """The global batch and what makes it: replicas x batch (x batches accumulated per optimizer step)."""
    accumulate = summary.get("accumulate", 1)  # absent from summaries written before it existed
    if accumulate == 1:
        return (
            "replicas x batch",
            f"{summary['world_size']} x {summary['per_replica_batch']} = {summary['global_batch']}",
        )
    return (
        "replicas x batch x accum.",
        f"{summary['world_size']} x {summary['per_replica_batch']} x {accumulate} = {summary['global_batch']}",
    )
