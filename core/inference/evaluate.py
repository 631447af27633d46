"""`hydrali eval RUN_DIR [split=val|test] [ckpt=best|last|<file>] [key=value ...]`: a trained run's checkpoint
scored on a split by its task's metrics and per-class figures, computed in core from what the backend's network
predicts (the same code for every backend). Printed as a table, written to RUN_DIR/eval/<split>/ (metrics.json and
the task's pictures) and logged to the run's MLflow run as eval/<split>/... metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydrali.core.data.image_files import images
from hydrali.core.errors import HydraliError
from hydrali.core.inference.loaded import Loaded, load
from hydrali.core.inference.trained_run import open_run
from hydrali.core.tracking.mlflow_runs import check_reachable, configure_http, log_to_finished_run

EVAL_DIR = "eval"
METRICS_FILE = "metrics.json"


def evaluate(path: str | None, overrides: list[str]) -> dict:
    """Score the run in `path` as `overrides` say; return what metrics.json holds."""
    run = open_run("eval", path, overrides)
    split = str(run.options.split)
    loaded = load(run, lambda task: task.evaluation_data(run.cfg.data, split, run.cfg.data.verify), "evaluation_data")
    scores = loaded.task.scores(loaded.dataset)
    for batch in loaded.batches(f"eval {split}"):
        scores.update(loaded.network.predict(batch), batch)
    result = {
        "split": split,
        "checkpoint": str(loaded.checkpoint),
        "images": scores.images,
        "metrics": {f"{split}/{name}": value for name, value in scores.metrics().items()},
        **scores.report(),
    }
    folder = run.run_dir / EVAL_DIR / split
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / METRICS_FILE, *scores.write_pictures(folder)]
    (folder / METRICS_FILE).write_text(json.dumps(result, indent=1) + "\n")
    print(_table(loaded, result, scores.per_class_table()), flush=True)
    _log(loaded, result, written, split)
    print(f"written: {', '.join(str(p) for p in written)}", flush=True)
    return result


def _table(loaded: Loaded, result: dict, per_class: list[str]) -> str:
    lines = [f"hydrali eval: {loaded.describe()}", f"split {result['split']}: {images(result['images'])}"]
    width = max(len(name) for name in result["metrics"])
    lines += [f"  {name:<{width}}  {value:.4f}" for name, value in result["metrics"].items()]
    return "\n".join([*lines, *(f"  {line}" for line in per_class)])


def _log(loaded: Loaded, result: dict, written: list[Path], split: str) -> None:
    """eval/<split>/<metric> and the per-class figures into the run's own MLflow run, the files as its artifacts."""
    cfg, run_file = loaded.run.cfg, loaded.run.run_file
    if not (cfg.tracking.enabled and cfg.tracking.uri and run_file.mlflow_run_id):
        return
    metrics = {f"{EVAL_DIR}/{name}": value for name, value in result["metrics"].items()}
    for name, row in result.get("per_class", {}).items():  # e.g. eval/val/recall/<class>; counts stay in the file
        for figure, value in row.items():
            if isinstance(value, float):
                metrics[f"{EVAL_DIR}/{split}/{figure}/{name}"] = value
    uri = str(cfg.tracking.uri)
    try:
        configure_http(cfg.tracking.timeout_s, cfg.tracking.retries)
        check_reachable(uri, cfg.tracking.timeout_s)
        log_to_finished_run(uri, run_file.mlflow_run_id, metrics, [(p, f"{EVAL_DIR}/{split}") for p in written])
    except HydraliError as err:  # the scores are written: MLflow is where they are shown too
        print(f"hydrali: warning: not logged to MLflow ({err}); the files above hold the scores", file=sys.stderr)
        return
    print(f"logged to MLflow run {run_file.mlflow_run_id} ({uri}) as {EVAL_DIR}/{split}/...", flush=True)
