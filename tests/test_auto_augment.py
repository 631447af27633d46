"""pipeline.options.auto_augment: DALI's automatic augmentation policies in the standard recipe change what training
reads (and nothing of validation), train on both backends, and a name that is not a policy is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from hydrali.core.data.pipelines import Source, make_pipeline
from hydrali.tasks.classification.datasets import write_digits
from tests.support.checks import fails_with, read_summary
from tests.support.cli import run_cli
from tests.support.configs import KERAS_QUIET, LIGHTNING_QUIET, SMALL_NET, with_plugin_callback

BATCH = 16
QUIET = {"lightning": LIGHTNING_QUIET, "keras": KERAS_QUIET}


def _batch(make_cfg, root, is_training: bool, policy: str | None) -> np.ndarray:
    """The first batch of the standard recipe (no flips) with `policy`, as the CPU pipeline returns it."""
    cfg = make_cfg("pipeline.options.flip_probability=0")
    options = {**OmegaConf.to_container(cfg.pipeline.options, resolve=True), "auto_augment": policy}
    pipe = make_pipeline(
        cfg.pipeline.recipe,
        options,
        batch_size=BATCH,
        num_threads=1,
        device_id=None,
        seed=7,
        prefetch_queue_depth=1,
        source=Source(str(root / ("train" if is_training else "val")), 0, 1, is_training),
        device="cpu",
        layout="HWC",
        image_size=32,
        dtype="float",
        hw_decoder_load=0.0,
    )
    pipe.build()
    images, _ = pipe.run()
    return np.stack([np.asarray(images[i]) for i in range(BATCH)])


@pytest.mark.parametrize("policy", ["rand_augment", "trivial_augment", "auto_augment"])
def test_a_policy_changes_training_images_and_leaves_validation_as_it_was(make_cfg, data_dir, policy):
    root = write_digits(data_dir / "digits", size=32, val_fraction=0.2)
    plain, augmented = (_batch(make_cfg, root, True, p) for p in (None, policy))
    changed = [not np.allclose(a, b) for a, b in zip(plain, augmented)]
    assert sum(changed) >= BATCH // 4, f"{policy} changed {sum(changed)} of {BATCH} images"
    assert np.allclose(_batch(make_cfg, root, False, None), _batch(make_cfg, root, False, policy))


def _images_trained_on(make_cfg, run_dir, backend: str, policy: str) -> list[str]:
    """A sha1 of each batch of images the network trained on in one epoch of the standard recipe with `policy`
    (null: none), as the framework handed them to it (tests/support/plugins.py: RecordBatches on Lightning, the
    images' recorder of keras_model_without_batchnorm on Keras)."""
    from hydrali.core.run.runner import run

    record = run_dir / "images.txt"
    if backend == "lightning":
        recorder = [with_plugin_callback("record", "RecordBatches", path=str(run_dir / "batches.jsonl"))]
    else:
        recorder = ["model.keras_target=tests.support.plugins.keras_model_without_batchnorm"]
        recorder.append(f"+model.record_images={record}")
    overrides = [f"pipeline.options.auto_augment={policy}", "epochs=1", *SMALL_NET, f"backend={backend}"]
    run(make_cfg(*overrides, *recorder, *QUIET[backend], "tracking=none", output_dir=run_dir))
    if backend == "lightning":
        steps = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
        seen = [f"{step['images']} {step['labels']}" for step in steps]
    else:
        seen = record.read_text().splitlines()
    assert len(seen) == read_summary(run_dir)["steps_per_epoch"], "a step the recorder did not see"
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lightning", pytest.param("keras", marks=pytest.mark.keras)])  # in this process
def test_the_network_trains_on_what_rand_augment_made_on_both_backends(make_cfg, tmp_path, backend):
    """What a user relies on: with a policy the network trains on augmented images. The same run without it trains
    on other images at every step (on Lightning, of the same labels: the same files, in the same order), and with
    it again on the same ones: the policy changed them, not chance."""
    plain, augmented, again = (
        _images_trained_on(make_cfg, tmp_path / name, backend, policy)
        for name, policy in (("plain", "null"), ("augmented", "rand_augment"), ("again", "rand_augment"))
    )
    assert len(plain) == len(augmented) > 1
    assert again == augmented, "the same run with the same seed trained on other images"
    for plain_step, augmented_step in zip(plain, augmented):
        assert plain_step.split()[0] != augmented_step.split()[0], "a batch of images rand_augment left as it was"
        assert plain_step.split()[1:] == augmented_step.split()[1:], "other labels: other files, or another order"


def test_a_name_that_is_not_a_policy_is_one_line(tmp_path, data_dir):
    fails_with(
        run_cli("pipeline.options.auto_augment=randaugment", f"paths.data_dir={data_dir}", cwd=tmp_path),
        "pipeline.options.auto_augment=randaugment is not a choice of recipe standard",
        "rand_augment | trivial_augment | auto_augment | null",
    )
