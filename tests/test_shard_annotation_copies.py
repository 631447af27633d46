"""The val annotation file of detection shards in object storage, copied out by every process of a job to the same
local path (tasks/detection/sharded.py) while the others load it: a process never reads a copy being written."""

from __future__ import annotations

import json
import multiprocessing

from tests.support.object_store import S3Server

COPIERS = 2  # processes that copy the file out of the bucket and load it, in turn, as each process of a job does
COPIES = 15  # copies (and loads) per copier
LOADERS = 2  # processes that meanwhile load the local copy again and again, as a process done with its copy does
IMAGES = 3_000  # with 10 boxes each: a file of 3 MB, as the COCO val split where 1 load in 40 found it empty
LOCATION = "s3://bucket/shards/val/annotations.json"


def _copy_and_load(local_copies: str, failures, done) -> None:
    from pathlib import Path

    from hydrali.core.errors import HydraliError
    from hydrali.tasks.detection import sharded
    from hydrali.tasks.detection.coco import load_coco_json

    for _ in range(COPIES):
        try:
            load_coco_json(sharded._local_annotations(LOCATION, Path(local_copies)))
        except HydraliError as err:
            failures.put(str(err).splitlines()[0])
    done.put(1)


def _load_until_done(copy: str, failures, done, loads) -> None:
    from pathlib import Path

    from hydrali.core.errors import HydraliError
    from hydrali.tasks.detection.coco import load_coco_json

    count = 0
    while done.qsize() < COPIERS:
        if Path(copy).exists():
            count += 1
            try:
                load_coco_json(Path(copy))
            except HydraliError as err:
                failures.put(str(err).splitlines()[0])
    loads.put(count)


def test_processes_copying_the_val_annotations_never_load_a_partial_copy(tmp_path, monkeypatch):
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 640, "height": 480} for i in range(IMAGES)]
    boxes = [
        {"id": i * 10 + k, "image_id": i, "category_id": 1 + k, "bbox": [k, k, 40.5, 30.25], "area": 1215.0}
        for i in range(IMAGES)
        for k in range(10)
    ]
    categories = [{"id": c, "name": str(c)} for c in range(1, 11)]
    source = tmp_path / "shards" / "val" / "annotations.json"
    source.parent.mkdir(parents=True)
    source.write_text(json.dumps({"images": images, "annotations": boxes, "categories": categories}))
    assert source.stat().st_size > 3_000_000
    copies = tmp_path / "copies"
    copy = copies / "webdataset" / "bucket_shards_val_annotations.json"  # where sharded.py puts it
    with S3Server() as s3:
        s3.upload(tmp_path / "shards", "bucket", "shards")
        for name, value in s3.env.items():
            monkeypatch.setenv(name, value)
        context = multiprocessing.get_context("spawn")
        failures, done, loads = context.Queue(), context.Queue(), context.Queue()
        workers = [context.Process(target=_copy_and_load, args=(str(copies), failures, done)) for _ in range(COPIERS)]
        workers += [
            context.Process(target=_load_until_done, args=(str(copy), failures, done, loads)) for _ in range(LOADERS)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=300)
        assert [worker.exitcode for worker in workers] == [0] * len(workers)
    seen = []
    while not failures.empty():
        seen.append(failures.get())
    loaded = COPIERS * COPIES + sum(loads.get() for _ in range(LOADERS))
    assert seen == [], f"{len(seen)} of {loaded} loads read a partial copy: {seen[:2]}"
    assert [p.name for p in copy.parent.iterdir()] == [copy.name], "a temporary copy was left behind"
    assert copy.stat().st_size == source.stat().st_size
