"""The plan: lr scaling rules, global batch, seeds and topology, the same for every backend."""

import math

import pytest

from hydrali.core.distributed.topology import detect_topology, is_first_process
from hydrali.core.errors import HydraliError
from hydrali.core.optim.schedule import lr_factor
from hydrali.core.policies.seeding import resolve_seed
from hydrali.core.run.plan import make_plan, scaled_lr


@pytest.mark.parametrize("rule, expected", [("linear", 0.4), ("sqrt", 0.2), ("none", 0.1)])
def test_each_lr_rule_scales_the_base_lr_by_global_over_ref_batch(rule, expected):
    assert scaled_lr(0.1, global_batch=1024, ref_batch=256, rule=rule) == pytest.approx(expected)


def test_lr_rules_agree_at_the_reference_batch():
    assert [scaled_lr(0.3, 256, 256, r) for r in ("linear", "sqrt", "none")] == pytest.approx([0.3] * 3)


def test_an_unknown_rule_is_an_error_naming_the_choices():
    with pytest.raises(HydraliError, match="linear, sqrt, none"):
        scaled_lr(0.1, 64, 256, "cubic")


def test_plan_global_batch_and_effective_lr_follow_the_world_size():
    topo = detect_topology(replicas_per_node=4, num_nodes=2, env={"RANK": "5", "LOCAL_RANK": "1", "NODE_RANK": "1"})
    plan = make_plan(
        topology=topo,
        batch_size=32,
        base_lr=0.1,
        ref_batch=256,
        rule="linear",
        warmup_epochs=1,
        epochs=3,
        seed=0,
        device="gpu",
    )
    assert (plan.world_size, plan.global_batch) == (8, 256)
    assert plan.effective_lr == pytest.approx(0.1)
    assert (plan.shard.shard_id, plan.num_shards, plan.shard.device_id) == (5, 8, 1)
    assert plan.params()["plan/effective_lr"] == plan.effective_lr


def test_shard_id_is_the_global_rank_not_the_local_rank():
    # second node, first GPU: Lightning's launcher gives only LOCAL_RANK and NODE_RANK
    topo = detect_topology(replicas_per_node=2, num_nodes=2, env={"LOCAL_RANK": "0", "NODE_RANK": "1"})
    assert (topo.shard_id, topo.local_rank, topo.num_shards) == (2, 0, 4)


def test_a_process_of_several_replicas_reads_consecutive_shards_by_global_rank():
    # Keras-style: 2 nodes, one process per node driving 4 replicas; this is the second node
    topo = detect_topology(replicas_per_node=4, num_nodes=2, env={"NODE_RANK": "1"}, replicas_per_process=4)
    plan = make_plan(
        topology=topo,
        batch_size=16,
        base_lr=0.1,
        ref_batch=256,
        rule="linear",
        warmup_epochs=0,
        epochs=1,
        seed=3,
        device="gpu",
    )
    assert [s.shard_id for s in plan.shards] == [4, 5, 6, 7]
    assert [s.device_id for s in plan.shards] == [0, 1, 2, 3]
    assert len({s.pipeline_seed for s in plan.shards}) == 4
    assert (plan.world_size, plan.num_shards, plan.global_batch) == (8, 8, 128)


def test_only_the_first_process_of_a_job_does_job_wide_work():
    assert is_first_process({})
    assert is_first_process({"RANK": "0", "LOCAL_RANK": "0", "NODE_RANK": "0"})
    assert not is_first_process({"LOCAL_RANK": "1"})  # Lightning's second process
    assert not is_first_process({"LOCAL_RANK": "0", "NODE_RANK": "1"})  # first process of the second node
    assert not is_first_process({"SLURM_PROCID": "5", "SLURM_LOCALID": "1"})


def test_slurm_ranks_are_read():
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "4"}
    topo = detect_topology(replicas_per_node=2, num_nodes=2, env=env)
    assert (topo.global_rank, topo.local_rank, topo.node_rank, topo.world_size) == (3, 1, 1, 4)


def test_a_launcher_world_that_disagrees_with_the_config_is_an_error():
    with pytest.raises(HydraliError, match="backend.devices"):
        detect_topology(replicas_per_node=1, num_nodes=1, env={"WORLD_SIZE": "4", "RANK": "0"})


def test_seed_zero_is_a_seed_and_null_draws_one():
    assert resolve_seed(0) == 0
    drawn = resolve_seed(None)
    assert isinstance(drawn, int) and 0 <= drawn < 2**31


def test_a_shard_gets_the_same_pipeline_seed_whichever_process_drives_it_and_each_shard_its_own():
    """Lightning (a process per replica) and Keras (a process driving every replica of its node) give shard i the
    same DALI seed; other shards, and the same shards under another run seed, get other seeds."""

    def seeds_of_one_process_per_replica(seed: int) -> list[int]:
        return [
            make_plan(
                topology=detect_topology(4, 1, env={"RANK": str(r), "LOCAL_RANK": str(r), "NODE_RANK": "0"}),
                seed=seed,
                **PLAN,
            ).shard.pipeline_seed
            for r in range(4)
        ]

    def seeds_of_one_process(seed: int) -> list[int]:
        plan = make_plan(topology=detect_topology(4, 1, env={}, replicas_per_process=4), seed=seed, **PLAN)
        return [shard.pipeline_seed for shard in plan.shards]

    lightning, keras = seeds_of_one_process_per_replica(42), seeds_of_one_process(42)
    assert lightning == keras
    assert len(set(lightning)) == 4, "every shard its own stream of augmentations"
    assert set(lightning).isdisjoint(seeds_of_one_process(43)), "another run seed: other streams on every shard"
    assert all(0 <= s < 2**31 for s in lightning + seeds_of_one_process(2**40)), "within DALI's seed range"


PLAN = dict(batch_size=16, base_lr=0.1, ref_batch=256, rule="linear", warmup_epochs=0, epochs=1, device="cpu")


def test_schedule_warms_up_linearly_then_decays_to_zero():
    kw = dict(steps_per_epoch=10, epochs=5, warmup_epochs=1, warmup_div=10.0, schedule="cosine")
    assert lr_factor(0, **kw) == pytest.approx(0.1)
    assert lr_factor(5, **kw) == pytest.approx(0.55)
    assert lr_factor(10, **kw) == pytest.approx(1.0)
    assert lr_factor(30, **kw) == pytest.approx(0.5)
    assert lr_factor(50, **kw) == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(25, **{**kw, "schedule": "constant"}) == 1.0
    assert math.isclose(lr_factor(3, **{**kw, "warmup_epochs": 0}), 0.5 * (1 + math.cos(math.pi * 3 / 50)))


@pytest.mark.parametrize("size_variable,launcher", [("OMPI_COMM_WORLD_SIZE", "Open MPI"), ("PMI_SIZE", "PMI")])
def test_mpi_processes_whose_ranks_cannot_be_known_are_one_error_not_n_rank_zeros(size_variable, launcher):
    with pytest.raises(HydraliError, match=f"4 processes were started by .*{launcher}.*torchrun or srun"):
        detect_topology(1, 1, env={size_variable: "4", "OMPI_COMM_WORLD_RANK": "2", "PMI_RANK": "2"})
    # one process of such a launcher, or its processes with torchrun's variables exported, are read as usual
    assert detect_topology(1, 1, env={size_variable: "1"}).global_rank == 0
    torchrun = {size_variable: "4", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}
    assert detect_topology(2, 2, env=torchrun).global_rank == 3


def test_accumulated_batches_count_in_the_global_batch_that_scales_the_lr():
    topo = detect_topology(replicas_per_node=2, num_nodes=1, env={"RANK": "0", "LOCAL_RANK": "0", "NODE_RANK": "0"})
    one = make_plan(topology=topo, seed=0, **{**PLAN, "batch_size": 64})
    four = make_plan(topology=topo, seed=0, accumulate=4, **PLAN)
    # 2 replicas x 16 images x 4 batches per optimizer step: the images of one step of 2 x 64
    assert (four.global_batch, four.images_per_batch, four.accumulate) == (128, 32, 4)
    assert four.effective_lr == pytest.approx(one.effective_lr) == pytest.approx(0.1 * 128 / 256)
    assert four.params()["plan/accumulate"] == 4
    with pytest.raises(HydraliError, match="optim.accumulate_grad_batches=0"):
        make_plan(topology=topo, seed=0, accumulate=0, **PLAN)


@pytest.mark.parametrize("last_batch", ["drop", "fill"])
def test_an_epoch_of_accumulated_batches_is_a_whole_number_of_optimizer_steps(last_batch):
    from hydrali.core.run.epoch import make_epoch_steps

    # 1,000 images over 2 shards of 500, batch 16: 31 whole batches (drop) or 32 (fill) a shard
    plain = make_epoch_steps(train_samples=1000, val_samples=100, num_shards=2, batch=16, last_batch=last_batch)
    for accumulate in (1, 2, 3, 4, 31):
        contract = make_epoch_steps(
            train_samples=1000, val_samples=100, num_shards=2, batch=16, last_batch=last_batch, accumulate=accumulate
        )
        # Lightning steps once per `accumulate` batches and once more for a rest at the epoch's end; Keras steps
        # every `accumulate` batches across epochs: with whole accumulations both take the same steps every epoch
        assert contract.train_steps % accumulate == 0
        assert plain.train_steps - accumulate < contract.train_steps <= plain.train_steps
        assert contract.optimizer_steps == plain.train_steps // accumulate
        assert contract.params()["epoch/optimizer_steps_per_epoch"] == contract.optimizer_steps
    with pytest.raises(HydraliError, match=f"accumulate_grad_batches=40 is more than the {plain.train_steps} batch"):
        make_epoch_steps(
            train_samples=1000, val_samples=100, num_shards=2, batch=16, last_batch=last_batch, accumulate=40
        )


def test_a_plan_resumed_at_an_epoch_seeds_each_shard_anew_and_no_two_alike():
    topo = detect_topology(replicas_per_node=4, num_nodes=1, env={}, replicas_per_process=4)
    plan = make_plan(topology=topo, seed=3, **PLAN)
    assert plan.resumed_at(0) == plan
    seeds = {(epoch, s.shard_id): s.pipeline_seed for epoch in range(4) for s in plan.resumed_at(epoch).shards}
    assert len(set(seeds.values())) == len(seeds) == 16, "a seed per shard and epoch"
    assert [s.pipeline_seed for s in plan.shards] == [seeds[0, shard] for shard in range(4)]
