"""How `pytest -n 2 --dist loadfile` (make test) hands the test files to its 2 workers: whole files, the files that
share one of the session's trained runs as one unit, so that the run is trained once and by one worker, and the
longest units first, so that the workers finish close together. Used by conftest.py's pytest_xdist_make_scheduler."""

from __future__ import annotations

from collections import OrderedDict

from xdist.scheduler import LoadFileScheduling

# The files whose tests use conftest.py's trained_on_both or detection_runs. A session fixture is built once in every
# worker that runs a test of it: as one unit, these files' tests run in one worker, and the runs are trained once
# (detection_runs: 5 epochs of detection on each backend, 194 s on the quiet 2 cores; trained_on_both: 110 s).
SHARED_RUNS = "tests: the files that use the session's trained runs"
FILES_OF_SHARED_RUNS = frozenset(
    {
        "tests/test_after_training.py",
        "tests/test_auto_settings.py",
        "tests/test_backends_agree.py",
        "tests/test_detection_training.py",
        "tests/test_flip_averaging.py",
        "tests/test_hints.py",
        "tests/test_leftovers.py",
        "tests/test_overhead.py",
    }
)

# Seconds each file took in a serial run of the whole suite on the 2-core CI machine (2026-11-26, junit times, the
# session's trained runs counted in the first file that used them); a file not named here took under 20 s. The files
# whose runs moved into the test process on 2026-11-27 (their hydrali commands that test no command line) are that
# figure scaled by new/old measured side by side on the shared, loaded 2 cores (the old file beside the new, one core
# each): test_fine_tuning 0.52, test_auto_augment 0.49, test_photo_defaults 0.43, test_webdataset_detection 0.57,
# test_pretrained 0.88, test_webdataset 0.86, test_keras 52 s -> 29 s for its XLA test; test_bad_files (no
# side-by-side measurement finished) is that figure less 14 s for its one command removed (the start-up and exit of
# one `hydrali`, measured on the quiet machine).
SECONDS_ALONE = {
    "tests/test_pretrained.py": 430,
    "tests/test_after_training.py": 375,
    "tests/test_preemption.py": 330,
    "tests/test_webdataset.py": 254,
    "tests/test_detection_training.py": 293,
    "tests/test_launch.py": 257,
    "tests/test_sweeps.py": 246,
    "tests/test_bad_input.py": 222,
    "tests/test_refusals.py": 207,
    "tests/test_run_dir.py": 196,
    "tests/test_start_from_run.py": 173,
    "tests/test_keras.py": 148,
    "tests/test_cifar10_recipe.py": 165,  # ResNet-9, 4 epochs: its two tests 64 s + 97 s under -n 2 (2026-11-27)
    "tests/test_ema.py": 90,
    "tests/test_webdataset_detection.py": 87,
    "tests/test_interrupt.py": 127,
    "tests/test_fine_tuning.py": 58,
    "tests/test_training.py": 103,
    "tests/test_bad_files.py": 86,
    "tests/test_multiprocess.py": 97,
    "tests/test_leftovers.py": 85,
    "tests/test_auto_augment.py": 35,
    "tests/test_bench_scaling.py": 62,
    "tests/test_keras_workers.py": 62,
    "tests/test_hints.py": 52,
    "tests/test_class_weights.py": 50,
    "tests/test_bench.py": 44,
    "tests/test_config.py": 37,
    "tests/test_model_names.py": 28,
    "tests/test_bench_training.py": 28,
    "tests/test_image_files.py": 70,
    "tests/test_autotune.py": 27,
    # issue 35's files of 2026-11-27, estimates from runs on the loaded 2 cores (about a third of what they took there)
    "tests/test_checkpoint_files.py": 105,
    "tests/test_decode_once.py": 30,
    "tests/test_bench_small.py": 20,
    # files that were missing here (counted as light, so handed out last: test_xla_cache ended the CI run of
    # 2026-11-27), under -n 2 on the 2 cores with their setups and teardowns, 2026-11-27
    "tests/test_xla_cache.py": 46,
    "tests/test_compile.py": 41,
    "tests/test_third_backend.py": 33,
    "tests/test_architecture.py": 25,
    "tests/test_mixing.py": 15,
    "tests/test_shard_annotation_copies.py": 14,
    "tests/test_resnet9.py": 13,
    "tests/test_progressive_resizing.py": 50,  # 2026-11-27, beside a full suite run (loaded)
    "tests/test_orphans.py": 44,  # 2026-11-27, alone on the loaded 2 cores
    "tests/test_rerun.py": 71,  # 2026-11-27, alone on the loaded 2 cores (53-71 s)
    "tests/test_global_batch.py": 40,  # 2026-11-27, alone on the loaded 2 cores
}
LIGHT_FILE_SECONDS = 10  # what a file not in SECONDS_ALONE counts as


class SharedRunsFirstScheduling(LoadFileScheduling):
    """xdist's loadfile scheduling (a file's tests run in one worker, in their order), with the files of
    FILES_OF_SHARED_RUNS as one unit and the units handed out longest first (by SECONDS_ALONE)."""

    _longest_first = False

    def _split_scope(self, nodeid: str) -> str:
        file = super()._split_scope(nodeid)
        return SHARED_RUNS if file in FILES_OF_SHARED_RUNS else file

    def _assign_work_unit(self, node) -> None:
        if not self._longest_first:  # the first assignment: the queue holds every unit
            self.workqueue = OrderedDict(sorted(self.workqueue.items(), key=lambda unit: -unit_seconds(unit[1])))
            self._longest_first = True
        super()._assign_work_unit(node)


def unit_seconds(nodeids) -> int:
    """The seconds a unit of tests took alone: the sum over its files."""
    files = {nodeid.split("::", 1)[0] for nodeid in nodeids}
    return sum(SECONDS_ALONE.get(file, LIGHT_FILE_SECONDS) for file in files)
