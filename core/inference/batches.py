"""The batches a trained network is run on: the task's validation recipe (the run's own preprocessing) over one
split, read by one process through DALI, as NumPy arrays trimmed of the reader's padding, so that every image is
read exactly once, in the reader's order, whichever backend runs the network."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from omegaconf import DictConfig

from hydrali.core.data.dali_errors import explain_dali_error
from hydrali.core.data.pipelines import reading_files
from hydrali.core.distributed.topology import Topology
from hydrali.core.run.plan import Plan, plan_of_config

ONE_PROCESS = Topology(world_size=1, global_rank=0, local_rank=0, node_rank=0, replicas_per_node=1)


def inference_plan(cfg: DictConfig, device: str) -> Plan:
    """The plan of one process reading one shard (the whole split) in batches of data.batch_size on `device`."""
    seed = cfg.seed if cfg.seed is not None else 0
    return plan_of_config(cfg, ONE_PROCESS, seed=seed, device=device, training=False)


def validation_pipeline(*, task, cfg: DictConfig, dataset, layout: str, device: str):
    """The task's validation pipeline (not yet built) over `dataset`'s validation split, one shard, on `device`: one
    that reads the files, whatever the run trained from (a recipe's decode_once gains nothing on one pass, and the
    pipeline hydrali export serializes must read files where it is served)."""
    plan = inference_plan(cfg, device)
    return task.build_pipeline(
        pipeline=reading_files(cfg.pipeline),
        data=cfg.data,
        model=cfg.model,
        dataset=dataset,
        plan=plan,
        shard=plan.shards[0],
        layout=layout,
        is_training=False,
    )


def _as_numpy(output) -> np.ndarray | list[np.ndarray]:
    """A DALI TensorList as one array, or one array per sample when their shapes differ."""
    if hasattr(output, "as_cpu"):  # on the GPU
        output = output.as_cpu()
    if output.is_dense_tensor():
        return output.as_array()
    return [np.array(sample) for sample in output]


def count_batches(images: int, batch: int) -> int:
    """The batches that hold `images` images (the last one padded by the reader)."""
    return math.ceil(images / batch)


def read_batches(*, task, cfg: DictConfig, dataset, layout: str, device: str) -> Iterator[dict[str, Any]]:
    """The task's validation pipeline over each image of `dataset`'s validation split once, one dict of NumPy
    outputs (the task's output names) per batch, padding removed; DALI's errors explained."""
    pipe = validation_pipeline(task=task, cfg=cfg, dataset=dataset, layout=layout, device=device)
    names = task.output_names(False)
    batch, images = cfg.data.batch_size, dataset.num_val
    try:
        pipe.build()
        for step in range(count_batches(images, batch)):
            keep = min(batch, images - step * batch)
            yield {name: value[:keep] for name, value in zip(names, map(_as_numpy, pipe.run()))}
    except RuntimeError as err:
        raise explain_dali_error(err, lambda: task.explain_decode_error(dataset)) from err
