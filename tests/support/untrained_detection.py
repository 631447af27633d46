"""The COCO mAP@.5 of an untrained detector on the bundled validation set, per backend: the baseline that a
short training run must lift. Built from the same config, recipe, network and scorer as a run."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
from hydra.utils import instantiate

from hydrali.core.distributed.topology import detect_topology
from hydrali.core.run.plan import make_plan
from tests.support.configs import compose_config

SEED = 0


def _validation_batches(backend: str, data_dir: Path):
    """(cfg, task, dataset, batches): the default detection config of `backend` and its val batches (numpy)."""
    cfg = compose_config(["task=detection", f"backend={backend}", "tracking=none"], Path(tempfile.mkdtemp()), data_dir)
    task = instantiate(cfg.task)
    dataset = task.prepare_data(cfg.data, verify="off")
    plan = make_plan(
        topology=detect_topology(1, 1, env={}),
        batch_size=cfg.data.batch_size,
        base_lr=0.0,
        ref_batch=cfg.optim.ref_batch,
        rule="none",
        warmup_epochs=0,
        epochs=1,
        seed=SEED,
        device="cpu",
    )
    pipe = task.build_pipeline(
        pipeline=cfg.pipeline,
        data=cfg.data,
        model=cfg.model,
        dataset=dataset,
        plan=plan,
        shard=plan.shard,
        layout="CHW" if backend == "lightning" else "HWC",
        is_training=False,
    )
    pipe.build()
    steps = math.ceil(dataset.num_val / plan.per_replica_batch)
    batches = [[np.array(out.as_tensor()) for out in pipe.run()] for _ in range(steps)]
    return cfg, task, dataset, batches


def untrained_map50_of(backend: str, data_dir: Path) -> float:
    """val/map50 of the randomly initialised detector of `backend` on the digits_detection val set."""
    cfg, task, dataset, batches = _validation_batches(backend, data_dir)
    if backend == "lightning":
        import torch

        from hydrali.tasks.detection.torch_task import build

        torch.manual_seed(SEED)
        side = build(task, cfg.model, dataset, cfg.data.image_size).eval()
        with torch.no_grad():
            for images, targets, image_ids in batches:
                side.validation_step(
                    {
                        "images": torch.from_numpy(images),
                        "targets": torch.from_numpy(targets),
                        "image_ids": torch.from_numpy(image_ids),
                    }
                )
        return side.validation.finish(0, draw=False)["val/map50"]

    import keras

    from hydrali.tasks.detection.keras_decode import decode_detections
    from hydrali.tasks.detection.keras_task import build

    keras.utils.set_random_seed(SEED)
    side = build(task, dataset)
    model = side.build_model(cfg.model, dataset.num_classes, cfg.data.image_size)
    for images, _, image_ids in batches:
        boxes, scores, labels, counts = (
            np.asarray(t)
            for t in decode_detections(model(images, training=False), side.anchors, **task.detection_args())
        )
        side.validation.add_batch(image_ids.reshape(-1).tolist(), boxes, scores, labels, counts=counts.tolist())
    return side.validation.finish(0, draw=False)["val/map50"]
