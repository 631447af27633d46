"""Gathering results across processes (hydrali.core.distributed.gather): objects of every process in rank order,
through a collective that gathers bytes, or one that only sums int32 arrays (as TensorFlow's all-reduce does).
The processes are threads here, meeting at a barrier: a collective of the test's own."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hydrali.core.distributed import gather
from tests.support.cli import free_port


class ThreadSum:
    """An all-reduce sum between `count` threads: each hands its array, each gets the sum of all of them."""

    def __init__(self, count: int):
        self.count = count
        self.arrays: dict[int, np.ndarray] = {}
        self.barrier = threading.Barrier(count)

    def for_rank(self, rank: int):
        def all_reduce_sum(values: np.ndarray) -> np.ndarray:
            assert values.dtype == np.int32
            self.arrays[rank] = values.copy()
            self.barrier.wait()
            shapes = {array.shape for array in self.arrays.values()}
            assert len(shapes) == 1, f"every process sums one shape, not {shapes}"
            total = sum(self.arrays.values())
            self.barrier.wait()  # every thread has read the arrays before the next call replaces them
            return total

        return all_reduce_sum


def on_threads(count: int, work) -> list:
    """work(rank) on `count` threads at once; their results by rank."""
    results = [None] * count
    errors = []

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except BaseException as err:  # noqa: BLE001 (reported below, on the test's thread)
            errors.append(err)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("count", [1, 2, 3])
def test_bytes_of_every_length_come_back_in_rank_order_through_a_summing_collective(count):
    collective = ThreadSum(count)
    shares = [b"", b"abc", bytes(range(256)) * 3][:count]  # empty, not a multiple of 4 bytes, every byte value
    results = on_threads(
        count, lambda rank: gather.all_gather_through_sum(collective.for_rank(rank), rank, count)(shares[rank])
    )
    assert results == [shares] * count


def test_objects_come_back_in_rank_order_on_every_process():
    collective = ThreadSum(2)
    mine = [([{"image_id": 1, "score": 0.1 + 0.2}], [1, 2]), ([], [3])]
    results = on_threads(
        2,
        lambda rank: gather.gather_objects(
            mine[rank], gather.all_gather_through_sum(collective.for_rank(rank), rank, 2)
        ),
    )
    assert results == [mine, mine], "floats, tuples and empty lists as they were sent"


def test_a_process_alone_gathers_its_own_object_and_an_installed_collective_is_the_default():
    assert gather.gather_objects({"a": 1}) == [{"a": 1}]
    try:
        gather.install(lambda data: [data, data])  # a job of two processes that sent the same
        assert gather.gather_objects((1, "x")) == [(1, "x"), (1, "x")]
        assert gather.gather_objects(2, lambda data: [data]) == [2], "a collective given wins over the installed"
    finally:
        gather.install(None)
    assert gather.installed() is None


# ---------------------------------------------------------------- detection's validation on torch.distributed

IMAGES = 4  # ids 1..4, 100 x 100 pixels, one box of category 1 each; process r detects images r + 1, r + 3 exactly
BOX = [10.0, 20.0, 30.0, 40.0]  # x, y, w, h in pixels


def _write_ground_truth(path) -> None:
    import json

    path.write_text(
        json.dumps(
            {
                "images": [
                    {"id": i, "file_name": f"{i}.jpg", "width": 100, "height": 100} for i in range(1, IMAGES + 1)
                ],
                "annotations": [
                    {"id": i, "image_id": i, "category_id": 1, "bbox": BOX, "area": BOX[2] * BOX[3], "iscrowd": 0}
                    for i in range(1, IMAGES + 1)
                ],
                "categories": [{"id": 1, "name": "box"}],
            }
        )
    )


def _score_on_gloo(rank: int, folder: str, port: int) -> None:
    """Process `rank` of 2: its images' exact detections, gathered with torch.distributed, scored; its
    metrics written to <folder>/rank<rank>.json."""
    import json
    from pathlib import Path

    import torch.distributed as dist

    from hydrali.backends.torch.collectives import all_gather_bytes
    from hydrali.tasks.detection.coco import CocoSplit
    from hydrali.tasks.detection.validation import DetectionValidation

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        split = CocoSplit(Path(folder), Path(folder) / "truth.json", IMAGES, IMAGES, (1,), ("box",))
        validation = DetectionValidation(split, pictures=0, pictures_dir=Path(folder) / "pictures")
        mine = list(range(rank + 1, IMAGES + 1, 2))
        x, y, w, h = (v / 100 for v in BOX)
        validation.add_batch(
            mine,
            [np.array([[x, y, x + w, y + h]])] * len(mine),
            [np.array([1.0])] * len(mine),
            [np.array([1])] * len(mine),
        )
        validation.gather_across_processes(all_gather_bytes)
        metrics = validation.finish(0, draw=False)
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(metrics))
    finally:
        dist.destroy_process_group()


def test_detections_gathered_through_torch_distributed_are_scored_over_every_image(tmp_path):
    import json

    import torch.multiprocessing as mp

    _write_ground_truth(tmp_path / "truth.json")
    mp.spawn(_score_on_gloo, args=(str(tmp_path), free_port()), nprocs=2, join=True)
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == {"val/map": 1.0, "val/map50": 1.0}
