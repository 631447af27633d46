"""Sharding and the epoch steps against what DALI's file reader actually reads."""

import pytest
from nvidia.dali import pipeline_def

from hydrali.core.data.pipelines import Source
from hydrali.core.errors import HydraliError
from hydrali.core.run.epoch import make_epoch_steps, shard_sizes
from hydrali.tasks.classification.datasets import scan_image_folder, write_digits
from hydrali.tasks.classification.recipes import read_files

BATCH = 48


@pipeline_def(batch_size=BATCH, num_threads=1, device_id=None)
def encoded_files(source):
    jpegs, _ = read_files(source, initial_fill=64)
    return jpegs


def files_read(root, shard_id, num_shards, is_training, batches) -> list[str]:
    """The files DALI's reader returns, batch after batch, for one shard."""
    pipe = encoded_files(source=Source(str(root), shard_id, num_shards, is_training), seed=1)
    pipe.build()
    names = []
    for _ in range(batches):
        (batch,) = pipe.run()
        names += [batch[i].source_info() for i in range(len(batch))]
    return names


@pytest.fixture(scope="module")
def digits(data_dir):
    return scan_image_folder(write_digits(data_dir / "digits", size=32, val_fraction=0.2))


@pytest.mark.parametrize("num_shards", [1, 2, 7])
def test_validation_reads_each_image_once_where_the_contract_counts_it(digits, num_shards):
    sizes = shard_sizes(digits.num_val, num_shards)
    # 360 images over 7 shards: 51 or 52 each, so that the shorter shards' padding is what gets masked
    assert (len(set(sizes)) > 1) == (num_shards == 7), sizes
    contract = make_epoch_steps(
        train_samples=digits.num_train,
        val_samples=digits.num_val,
        num_shards=num_shards,
        batch=BATCH,
        last_batch="drop",
    )
    counted = []
    for shard in range(num_shards):
        # two validations in a row: the second reads the same shard again, in the same order
        names = files_read(digits.val_dir, shard, num_shards, False, 2 * contract.val_steps)
        first, second = names[: len(names) // 2], names[len(names) // 2 :]
        assert first == second
        kept = [
            name
            for step in range(contract.val_steps)
            for name in first[step * BATCH : step * BATCH + contract.val_valid(shard, step)]
        ]
        dropped = [n for i, n in enumerate(first) if i >= len(kept)]
        assert len(set(kept)) == len(kept), "no image counted twice within a shard"
        assert set(dropped) <= {kept[-1]}, "what the contract drops is the reader's padding"
        counted += kept
    assert len(counted) == len(set(counted)) == digits.num_val == 360
    assert set(counted) == {str(p.relative_to(digits.val_dir)) for p in digits.val_dir.glob("*/*.jpg")}


def test_training_shards_of_an_epoch_are_disjoint_and_hold_whole_batches(digits):
    contract = make_epoch_steps(
        train_samples=digits.num_train, val_samples=digits.num_val, num_shards=2, batch=BATCH, last_batch="drop"
    )
    assert contract.train_steps == (digits.num_train // 2) // BATCH
    epoch = [files_read(digits.train_dir, shard, 2, True, contract.train_steps) for shard in (0, 1)]
    for names in epoch:
        assert len(names) == len(set(names)) == contract.train_steps * BATCH, "no repeats in an epoch"
    assert set(epoch[0]).isdisjoint(epoch[1])


def test_a_batch_larger_than_a_shard_is_refused_saying_what_to_change():
    with pytest.raises(HydraliError, match="data.batch_size=4000 is larger than a shard.*at most 1437"):
        make_epoch_steps(train_samples=1437, val_samples=360, num_shards=1, batch=4000, last_batch="drop")
    with pytest.raises(HydraliError, match="a shard holds 718.*fewer replicas"):
        make_epoch_steps(train_samples=1437, val_samples=360, num_shards=2, batch=1000, last_batch="drop")


def test_fill_takes_the_last_partial_batch_and_drop_does_not():
    drop = make_epoch_steps(train_samples=1437, val_samples=360, num_shards=1, batch=64, last_batch="drop")
    fill = make_epoch_steps(train_samples=1437, val_samples=360, num_shards=1, batch=64, last_batch="fill")
    assert (drop.train_steps, fill.train_steps) == (22, 23)
    assert drop.val_steps == fill.val_steps == 6
    assert [drop.val_valid(0, s) for s in range(6)] == [64] * 5 + [40]
