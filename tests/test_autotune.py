"""pipeline.autotune=true: candidates, selection, the probe on real DALI pipelines, and a run that trains with its
choice."""

from __future__ import annotations

import json
import os

import pytest

from hydrali.core.data import autotune
from hydrali.core.data.autotune import Setting, Trial
from tests.support.checks import read_summary
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, SMALL_NET, with_plugin_callback
from tests.support.plugins import SIGNAL_AT_STEP


def test_thread_candidates_stay_within_the_cores_without_duplicates_and_keep_the_configured_value():
    cores = len(os.sched_getaffinity(0))
    for configured in range(1, cores + 1):
        values = autotune.thread_candidates(configured, cores)
        assert configured in values and len(values) == len(set(values)) and values == sorted(values)
        assert all(1 <= v <= cores for v in values)
    assert autotune.thread_candidates(2, 16) == [2, 4, 8, 16]
    assert autotune.thread_candidates(3, 16) == [2, 3, 4, 8, 16]
    assert autotune.thread_candidates(2, 16, explicit=[4, 4, 32, 8]) == [2, 4, 8], "explicit: kept within the budget"
    with pytest.raises(Exception, match="autotune_threads"):
        autotune.thread_candidates(2, 16, explicit=[0])


def test_the_core_budget_splits_a_shared_machine_between_the_node_s_pipelines():
    assert autotune.core_budget(1, 1, cores=16, machine_cores=16) == 16
    assert autotune.core_budget(8, 1, cores=16, machine_cores=16) == 2, "8 DDP processes share 16 cores"
    assert autotune.core_budget(8, 1, cores=2, machine_cores=16) == 2, "a launcher bound this process to 2 cores"
    assert autotune.core_budget(2, 2, cores=16, machine_cores=16) == 8, "one process, 2 replicas (Keras)"
    assert autotune.core_budget(16, 1, cores=4, machine_cores=4) == 1


def test_load_candidates_are_shares_and_keep_the_configured_value():
    assert autotune.load_candidates(0.65, [0.5, 0.8, 1.0, 1.0]) == [0.5, 0.65, 0.8, 1.0]
    with pytest.raises(Exception, match="not a share"):
        autotune.load_candidates(0.65, [1.5])


def test_pick_takes_the_fastest_complete_trial_and_the_configured_one_on_a_tie():
    a, b, c = Setting(1, 0.65), Setting(2, 0.65), Setting(2, 1.0)
    trials = [Trial(a, 100.0), Trial(b, 180.0), Trial(c, 0.0, complete=False)]
    assert autotune.pick(trials, prefer=a) == b
    assert autotune.pick([Trial(a, 100.0), Trial(b, 100.5)], prefer=a) == a, "within 1%: keep the configured"
    assert autotune.pick([Trial(a, 100.0), Trial(b, 130.0)], prefer=a) == b


@pytest.fixture
def digits_source(data_dir):
    from hydrali.core.data.pipelines import Source
    from hydrali.tasks.classification.datasets import write_digits

    root = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    return Source(str(root / "train"), 0, 1, True)


def _light(source, num_threads: int, image_size: int, batch: int = 64):
    from hydrali.core.data.pipelines import make_pipeline

    options = {"mean": [0.5] * 3, "std": [0.25] * 3, "initial_fill": 256}
    pipe = make_pipeline(
        "hydrali.tasks.classification.recipes.light",
        options,
        batch_size=batch,
        num_threads=num_threads,
        device_id=None,
        seed=1,
        prefetch_queue_depth=2,
        source=source,
        device="cpu",
        layout="CHW",
        image_size=image_size,
        dtype="float",
        hw_decoder_load=0.65,
    )
    pipe.build()
    return pipe


def test_the_probe_picks_the_faster_of_two_real_pipelines_and_tears_them_down(digits_source):
    """Real DALI pipelines: the setting whose pipeline does ~250x the work per image (resize to 256 x 256 instead
    of 16 x 16) is made clearly slower; the probe measures both, cuts the slow one short and picks the fast one.
    Their worker threads are gone afterwards."""
    fast, slow = Setting(1), Setting(2)
    sizes = {fast: 16, slow: 256}
    threads_before = len(os.listdir("/proc/self/task"))
    for order in ([slow, fast], [fast, slow]):
        trials = autotune.probe(
            order, lambda s: _light(digits_source, s.num_threads, sizes[s]), batch_size=64, warmup=2, batches=4
        )
        assert [t.setting for t in trials] == order
        assert autotune.pick(trials) == fast, trials
    assert not trials[1].complete, "the slow one, probed after the fast one, is cut short"
    assert len(os.listdir("/proc/self/task")) <= threads_before, "the probe's DALI threads are gone"


def test_the_gpu_search_tries_each_load_at_the_most_threads_then_the_threads_and_times_the_configured_whole(
    digits_source,
):
    """The coordinate search on real (CPU) pipelines, which take the load as a GPU decoder would and ignore it: each
    load at the most threads, then the other thread counts at the chosen load, then the configured setting, timed
    whole whatever the best so far (its rate is the log line's baseline)."""
    configured = Setting(1, 0.65)
    trials = autotune.search(
        configured,
        [1, 2],
        [0.5, 0.65, 1.0],
        lambda s: _light(digits_source, s.num_threads, 16),
        batch_size=64,
        warmup=2,
        batches=3,
    )
    settings = [t.setting for t in trials]
    assert settings[:3] == [Setting(2, 0.5), Setting(2, 0.65), Setting(2, 1.0)]
    best_load = autotune.pick(trials[:3], prefer=Setting(2, 0.65)).hw_decoder_load
    assert settings[3:] == [Setting(1, best_load)] + ([configured] if best_load != 0.65 else [])
    assert all(t.complete for t in trials if t.setting == configured)


def test_the_probe_leaves_the_run_s_data_order_as_it_was(digits_source):
    """The labels of a fresh training pipeline's first batches are the same before and after a probe of the same
    recipe, shard and seed: the probe's pipelines share no state with the run's."""

    def first_labels(pipe, batches=3):
        return [pipe.run()[1].as_array().ravel().tolist() for _ in range(batches)]

    before = first_labels(_light(digits_source, 2, 16))
    autotune.probe(
        [Setting(1), Setting(2)], lambda s: _light(digits_source, s.num_threads, 16), batch_size=64, warmup=2, batches=3
    )
    assert first_labels(_light(digits_source, 2, 16)) == before


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])
def test_a_run_with_autotune_times_training_steps_and_trains_with_the_chosen_threads(
    make_cfg, tmp_path, caplog, backend
):
    """A tiny run with pipeline.autotune=true (timed by training steps, the default): the network trained the
    probe's steps besides the run's own (counted by the network itself), the choice is logged in one line, is a
    candidate, is in the MLflow run's params, and (Lightning) is what the training iterator's DALI pipeline runs
    with (read by a callback)."""
    from mlflow.tracking import MlflowClient

    from hydrali.core.run.runner import run

    seen, steps, out = tmp_path / "threads.json", tmp_path / "steps.txt", tmp_path / "run"
    observe = (
        [with_plugin_callback("threads", "RecordPipelineThreads", path=str(seen))] if backend == "lightning" else []
    )
    cfg = make_cfg(
        *SMALL_NET,
        *(LIGHTNING_QUIET if backend == "lightning" else KERAS_QUIET),
        f"backend={backend}",
        "pipeline=light",
        "epochs=1",
        "data.verify=off",
        "pipeline.autotune=true",
        "pipeline.autotune_warmup=1",
        "pipeline.autotune_batches=3",
        "model._target_=tests.support.plugins.torch_model_without_batchnorm",
        "model.keras_target=tests.support.plugins.keras_model_without_batchnorm",
        f"+model.record_steps={steps}",
        *observe,
        output_dir=out,
    )
    cores = len(os.sched_getaffinity(0))
    asked_threads = cfg.pipeline.num_threads
    candidates = autotune.thread_candidates(asked_threads, autotune.core_budget(1, 1))
    with caplog.at_level("INFO", logger="hydrali"):
        run(cfg)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autotune: ")]
    assert len(lines) == 1 and "settings timed by training steps in" in lines[0], lines
    probed = int(lines[0].rpartition("); ")[2].split()[0])
    summary = read_summary(out)
    run_steps = summary["history"][0]["train/images"] // cfg.data.batch_size
    warmup = cfg.pipeline.prefetch_queue_depth + 1  # autotune_warmup=1 is raised to the batches DALI prepared ahead
    probe_steps = len(steps.read_text().splitlines()) - run_steps
    assert probed * (warmup + 1) <= probe_steps <= probed * (warmup + 3), (probed, probe_steps, run_steps)
    params = MlflowClient(cfg.tracking.uri).get_run(summary["mlflow_run_id"]).data.params
    chosen = int(params["pipeline.num_threads"])
    assert chosen in candidates and 1 <= chosen <= cores
    assert f"num_threads {chosen} " in lines[0]
    if backend == "lightning":
        assert json.loads(seen.read_text()) == [chosen], "DALI trained with the chosen num_threads"
    assert params["pipeline.autotune"] == "True" and params["pipeline.autotune_by"] == "training"
    # run.json: the settings as asked (what the same command started again is compared with), and what the attempt
    # decided and trained by: autotune's choice, the `auto` speed settings as resolved on this CPU, the plan
    written = json.loads((out / "run.json").read_text())
    assert written["config"]["pipeline"]["num_threads"] == asked_threads
    assert written["config"]["backend"]["precision"] == "auto"
    decided = written["decided"]
    assert decided["pipeline"]["num_threads"] == chosen
    assert (decided["precision"], decided["compile"]) == ("32-true", False)
    assert decided["plan"]["plan/global_batch"] == cfg.data.batch_size


@pytest.mark.slow
def test_a_preempted_autotuned_run_started_again_in_its_dir_resumes(make_cfg, tmp_path, caplog, monkeypatch):
    """A preempted run with pipeline.autotune=true, started again by the same command in its dir (what a requeued
    job runs), resumes although autotune chose another pipeline.num_threads than asked: run.json keeps the setting
    as asked, the choice is each attempt's own (before, the attempt was refused: "holds a run with other settings
    (pipeline.num_threads is 1 there, 2 here)", and the run stayed KILLED). The probe times both settings on real
    pipelines; which one a machine finds faster is chance on CI's 2 busy cores, so the pick among the timed trials
    is made the other setting's here (autotune.pick's own rule has its test above), as on a machine where it is."""
    from hydrali.bench.synthetic import write_synthetic
    from hydrali.core.process.preemption import Preempted
    from hydrali.core.run.runner import run

    photos = write_synthetic(tmp_path / "photos", classes=4, train_per_class=64, val_per_class=8)
    out = tmp_path / "run"
    asked = [
        "data=imagefolder",
        f"data.root={photos}",
        "data.batch_size=32",
        *SMALL_NET,
        *LIGHTNING_QUIET,
        "epochs=1",
        "data.verify=off",
        "tracking=none",
        "pipeline.num_threads=2",
        "pipeline.autotune=true",
        "pipeline.autotune_by=decode",
        "pipeline.autotune_threads=[1]",
        with_plugin_callback("record", "RecordBatches", path=str(tmp_path / "batches.jsonl")),
    ]
    monkeypatch.setattr(
        autotune, "pick", lambda trials, prefer=None: next(t.setting for t in trials if t.setting != prefer)
    )
    monkeypatch.setenv(SIGNAL_AT_STEP, "3")  # SIGUSR1 after the 3rd of the epoch's 8 steps, once
    with caplog.at_level("INFO", logger="hydrali"), pytest.raises(Preempted):
        run(make_cfg(*asked, output_dir=out))
    choices = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autotune: ")]
    assert len(choices) == 1 and choices[0].startswith("autotune: num_threads 1 "), choices
    recorded = json.loads((out / "run.json").read_text())["config"]["pipeline"]
    assert (recorded["num_threads"], recorded["autotune"]) == (2, True), choices
    caplog.clear()
    with caplog.at_level("INFO", logger="hydrali"):
        run(make_cfg(*asked, output_dir=out))
    assert any("holds this run, with the same settings" in r.getMessage() for r in caplog.records), choices
    summary = read_summary(out)
    assert len(summary["history"]) == 1 and summary["history"][0]["train/images"] == 8 * 32, summary["history"]
