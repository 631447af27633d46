"""Sharding through the real DALI file reader: the shards of one epoch are disjoint and cover the data."""
from nvidia.dali import pipeline_def

from tasks.classification.datasets import scan_image_folder, write_digits
from tasks.classification.recipes import read_files


@pipeline_def(batch_size=32, num_threads=1, device_id=None)
def encoded_files(file_root, shard_id, num_shards):
    jpegs, _ = read_files(file_root, shard_id, num_shards, is_training=True, initial_fill=64)
    return jpegs


def files_of_one_epoch(file_root, shard_id, num_shards) -> list[str]:
    pipe = encoded_files(file_root=file_root, shard_id=shard_id, num_shards=num_shards, seed=1)
    pipe.build()
    shard_size = pipe.reader_meta("Reader")["epoch_size_padded"] // num_shards
    names = []
    while len(names) < shard_size:
        (batch,) = pipe.run()
        names += [batch[i].source_info() for i in range(len(batch))]
    return names[:shard_size]


def test_two_shards_of_an_epoch_are_disjoint_and_cover_the_dataset(data_dir):
    root = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    info = scan_image_folder(root)
    shard0 = files_of_one_epoch(str(info.train_dir), 0, 2)
    shard1 = files_of_one_epoch(str(info.train_dir), 1, 2)
    # pad_last_batch repeats a shard's last file to fill its last batch: compare sets
    assert set(shard0).isdisjoint(shard1)
    assert set(shard0) | set(shard1) == {str(p.relative_to(info.train_dir)) for p in info.train_dir.glob("*/*.jpg")}
    assert len(set(shard0) | set(shard1)) == info.num_train
