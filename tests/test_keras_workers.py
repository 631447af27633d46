"""Keras workers started by the user with their own TF_CONFIG train one job (MultiWorkerMirroredStrategy):
each reads the shard of its rank, they agree on rank 0's run dir and seed, the chief alone writes, and a
detection validation is scored once over every worker's detections."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hydrali.core.distributed.topology import (
    TFWorkers,
    detect_topology,
    is_first_process,
    launched_externally,
    tf_config_workers,
)
from hydrali.core.errors import HydraliError
from tests.support.checks import read_summary
from tests.support.cli import free_ports, start_cli
from tests.support.datasets import write_one_image_per_class
from tests.support.keras_plugins import DETECTIONS_ENV, RECORD_ENV, read_detections, read_record


def tf_config(workers: list[str], kind: str, index: int, chief: str | None = None) -> str:
    """TF_CONFIG for the task `kind` `index` of a cluster of `workers` (and a chief)."""
    cluster = {"worker": workers, **({"chief": [chief]} if chief else {})}
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def test_tf_config_maps_workers_onto_ranks_chief_first():
    two = ["127.0.0.1:1", "127.0.0.1:2"]
    for index in (0, 1):
        env = {"TF_CONFIG": tf_config(two, "worker", index)}
        topo = detect_topology(1, 2, env)
        assert (topo.world_size, topo.global_rank, topo.node_rank, topo.local_rank) == (2, index, index, 0)
        assert topo.shard_ids == (index,) and topo.num_shards == 2
        assert is_first_process(env) == (index == 0) and launched_externally(env)
    # a chief is rank 0; the workers follow it
    assert tf_config_workers({"TF_CONFIG": tf_config(two, "chief", 0, chief="h:0")}) == TFWorkers(count=3, rank=0)
    assert tf_config_workers({"TF_CONFIG": tf_config(two, "worker", 1, chief="h:0")}) == TFWorkers(count=3, rank=2)
    assert not is_first_process({"TF_CONFIG": tf_config(two, "worker", 0, chief="h:0")})
    assert detect_topology(1, 3, {"TF_CONFIG": tf_config(two, "worker", 0, chief="h:0")}).shard_ids == (1,)
    # torchrun's or SLURM's ranks win over a TF_CONFIG left in the environment; none at all: no workers
    assert tf_config_workers({"TF_CONFIG": tf_config(two, "worker", 1), "RANK": "0"}) is None
    assert tf_config_workers({}) is None
    with pytest.raises(HydraliError, match="'ps'"):
        tf_config_workers({"TF_CONFIG": json.dumps({"cluster": {"ps": ["h:1"]}, "task": {"type": "ps"}})})
    with pytest.raises(HydraliError, match="worker 2 but its cluster lists 2"):
        tf_config_workers({"TF_CONFIG": tf_config(two, "worker", 2)})
    with pytest.raises(HydraliError, match="not TensorFlow's cluster JSON"):
        tf_config_workers({"TF_CONFIG": "{not json"})
    with pytest.raises(HydraliError, match="started 2 processes"):
        detect_topology(1, 1, {"TF_CONFIG": tf_config(two, "worker", 0)})


def test_srun_tasks_are_keras_workers_ranked_by_slurm(monkeypatch):
    from hydrali.backends.keras import workers

    slurm = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_NNODES": "2"}
    assert workers.slurm_tasks(slurm) == (2, 2)
    assert workers.slurm_tasks({**slurm, "SLURM_NTASKS": "1"}) is None, "one task: no workers"
    assert workers.slurm_tasks({**slurm, "RANK": "3"}) is None, "torchrun inside srun: its ranks"
    with pytest.raises(HydraliError, match="same number of tasks on every node"):
        workers.slurm_tasks({**slurm, "SLURM_NTASKS": "3"})
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    assert workers.cluster() == TFWorkers(count=4, rank=3)
    topo = detect_topology(2, 2, replicas_per_process=1)
    assert (topo.global_rank, topo.local_rank, topo.node_rank, topo.shard_ids) == (3, 1, 1, (3,))


WORKERS_TIMEOUT = 300  # seconds for 2 workers to start TensorFlow, train one tiny epoch and validate


def run_two_workers(tmp_path: Path, args: list[str], env_of) -> None:
    """Start hydrali with `args` as 2 Keras workers on 127.0.0.1 (worker `index` with its own TF_CONFIG, TMPDIR
    tmp_path/tmp<index> and the variables `env_of(index)`), from tmp_path; check that both succeed."""
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    procs = []
    try:
        for index in (0, 1):
            (tmp_path / f"tmp{index}").mkdir()
            env = {
                "TF_CONFIG": tf_config(workers, "worker", index),
                "TMPDIR": str(tmp_path / f"tmp{index}"),
                **env_of(index),
            }
            procs.append(start_cli(*args, cwd=tmp_path, env=env))
            time.sleep(1.2)  # a later second: Hydra's ${now:...} run dir differs, the workers must agree on one
        outputs = [proc.communicate(timeout=WORKERS_TIMEOUT)[0] for proc in procs]
    finally:
        for proc in procs:  # a worker left waiting for one that failed
            if proc.poll() is None:
                proc.kill()
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out[-4000:]


IMAGES, BATCH = 32, 8  # 2 workers x 1 replica: shards of 16 images, 2 training steps per epoch
# (pipeline.options.initial_fill=1: DALI's shuffle buffer draws nothing from the next pass, so one epoch reads each
# image of a shard exactly once)


@pytest.mark.slow
def test_two_keras_workers_from_tf_config_train_one_epoch_on_disjoint_shards_and_the_chief_alone_writes(tmp_path):
    data = tmp_path / "images"
    write_one_image_per_class(data, IMAGES, size=16)
    args = [
        "backend=keras",
        "pipeline=light",
        "data=imagefolder",
        f"data.root={data}",
        f"data.batch_size={BATCH}",
        "data.image_size=16",
        "model.widths=[8,16,32]",
        "pipeline.options.initial_fill=1",
        "epochs=1",
        "seed=null",
        "task.sides.keras=tests.support.keras_plugins.recording_classification",
    ]
    run_two_workers(tmp_path, args, lambda index: {RECORD_ENV: str(tmp_path / f"labels{index}.txt")})

    run_dirs = [d for d in tmp_path.glob("outputs/*/*") if d.is_dir()]
    assert len(run_dirs) == 1, f"one run dir for the job: {run_dirs}"
    run_dir = run_dirs[0]
    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and summary["global_batch"] == 2 * BATCH and summary["epochs"] == 1
    assert [p.name for p in (run_dir / "checkpoints").glob("*.weights.h5")] == ["epoch001.weights.h5"]
    assert (run_dir / "tensorboard").is_dir()
    written = {
        name: sorted(p for p in tmp_path.rglob(name) if "mlartifacts" not in p.parts)
        for name in ("summary.json", "*.weights.h5", "events.out.tfevents.*", "tensorboard", "checkpoints")
    }
    assert all(run_dir in path.parents for paths in written.values() for path in paths), f"only the chief: {written}"
    assert len(list(tmp_path.glob("mlartifacts/**/*.weights.h5"))) == 1, "the chief logged the best checkpoint"
    assert not any((tmp_path / "tmp1").iterdir()), "the non-chief's throwaway checkpoint is gone"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("hydrali").experiment_id])
    assert run.info.run_id == summary["mlflow_run_id"] and run.data.params["plan/world_size"] == "2"

    (seed0, batches0), (seed1, batches1) = (read_record(tmp_path / f"labels{i}.txt") for i in (0, 1))
    assert seed0 == seed1 == run.data.params["plan/seed"], "both workers train with the one seed that is logged"
    assert len(batches0) == len(batches1) == 2 and all(len(b) == BATCH for b in batches0 + batches1)
    read = [sorted(label for batch in batches for label in batch) for batches in (batches0, batches1)]
    assert not set(read[0]) & set(read[1]), "the workers read disjoint samples"
    assert sorted(read[0] + read[1]) == list(range(IMAGES)), "together they read the epoch, each image once"
    assert read == [shard_labels(data / "train", shard, 2) for shard in (0, 1)], "worker r reads DALI's shard r"


# task=detection on the bundled digits, as small as they go: 16 + 32 images of 32 x 32 (digits of 16-24 pixels on a
# 64-pixel canvas), 2 workers x batch 4: 2 training and 4 validation steps each; every detection scored (no score
# threshold), so that an untrained detector finds some digits and the mAP of one worker's shard is not all images'
DETECTION = [
    "task=detection",
    "backend=keras",
    "data.generate.num_train=16",
    "data.generate.num_val=32",
    "data.generate.canvas=64",
    "data.generate.min_size=16",
    "data.generate.max_size=24",
    "data.image_size=32",
    "data.batch_size=4",
    "model.widths=[8,16,32,64]",
    "epochs=1",
    "task.score_threshold=0.0",
    "task.pictures=2",
    "task.sides.keras=tests.support.keras_plugins.recording_detection",
]


@pytest.mark.slow
def test_two_keras_workers_score_detection_once_over_all_images_and_the_chief_alone_draws(tmp_path):
    run_two_workers(
        tmp_path,
        [*DETECTION, f"paths.data_dir={tmp_path / 'data'}"],
        lambda index: {DETECTIONS_ENV: str(tmp_path / f"detections{index}.jsonl")},
    )

    run_dirs = [d for d in tmp_path.glob("outputs/*/*") if d.is_dir()]
    assert len(run_dirs) == 1, f"one run dir for the job: {run_dirs}"
    run_dir = run_dirs[0]
    pictures = sorted(p for p in tmp_path.rglob("pictures") if "mlartifacts" not in p.parts)
    assert pictures == [run_dir / "pictures"], "the chief alone draws, into the agreed run dir"
    assert [p.name for p in pictures[0].iterdir()] == ["val_epoch001.png"]

    annotations = tmp_path / "data" / "digits_detection" / "annotations" / "instances_val2017.json"
    val_images = {image["id"] for image in json.loads(annotations.read_text())["images"]}
    shares = [read_detections(tmp_path / f"detections{index}.jsonl") for index in (0, 1)]
    seen = [{d["image_id"] for d in share} for share in shares]
    assert all(seen) and not seen[0] & seen[1] and seen[0] | seen[1] <= val_images, "each worker its own shard"
    every = coco_map_of(annotations, shares[0] + shares[1])
    assert every > 0 and every != pytest.approx(coco_map_of(annotations, shares[0]), abs=1e-9), (
        "the mAP of all images is not that of one worker's shard"
    )

    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and summary["val_images"] == len(val_images)
    assert summary["final"]["val/map"] == pytest.approx(every, abs=1e-9), "scored once, over all images"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (logged,) = client.get_metric_history(summary["mlflow_run_id"], "val/map")
    assert logged.value == pytest.approx(every, abs=1e-9)
    assert [a.path for a in client.list_artifacts(summary["mlflow_run_id"], "pictures")] == [
        "pictures/val_epoch001.png"
    ]


def coco_map_of(annotations: Path, detections: list[dict]) -> float:
    """COCO mAP@[.5:.95] of `detections` over every image of the annotation file, as faster-coco-eval gives it."""
    from faster_coco_eval import COCO, COCOeval_faster

    truth = COCO(str(annotations))
    evaluation = COCOeval_faster(truth, truth.loadRes(detections), iouType="bbox", print_function=lambda *a: None)
    evaluation.run()
    return max(0.0, float(evaluation.stats_as_dict["AP_all"]))


def shard_labels(folder: Path, shard: int, shards: int) -> list[int]:
    """The labels in shard `shard` of `shards` of an image folder, as DALI's file reader cuts it for training
    (it shuffles the file list once, with a fixed seed, before cutting it into shards)."""
    from nvidia.dali import fn, pipeline_def

    size = IMAGES // shards

    @pipeline_def(batch_size=size, num_threads=1, device_id=None)
    def reader():
        _, labels = fn.readers.file(
            file_root=str(folder),
            shard_id=shard,
            num_shards=shards,
            random_shuffle=True,
            stick_to_shard=True,
            initial_fill=1,
        )
        return labels

    pipe = reader()
    pipe.build()
    (labels,) = pipe.run()
    return sorted(int(labels.at(i)[0]) for i in range(size))
