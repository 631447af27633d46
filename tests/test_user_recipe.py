"""A user's own classification recipe (pipeline.recipe=<import path>) that declares only the arguments every recipe
gets and its options trains: hydrali gives the number of classes (mixup and cutmix's soft labels) only to a recipe
that declares it."""

from __future__ import annotations

import json

from hydrali.core.run.runner import run
from tests.support.configs import LIGHTNING_QUIET, TINY


def test_a_recipe_without_num_classes_trains(make_cfg, tmp_path):
    cfg = make_cfg(
        *TINY,
        *LIGHTNING_QUIET,
        "pipeline.recipe=tests.support.recipes.decode_resize",
        "pipeline.device=cpu",
        "epochs=1",
        "tracking=none",
        "data.verify=off",
        output_dir=tmp_path / "run",
    )
    run(cfg)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epochs"] == 1 and summary["history"][-1]["train/images"] > 0
