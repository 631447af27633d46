"""Building a DALI pipeline from a recipe named in the config (`pipeline.recipe`)."""
from __future__ import annotations

import importlib
import inspect

from core.errors import HydraliError


def load_recipe(path: str):
    """The @pipeline_def function at import path `path` (e.g. tasks.classification.recipes.standard)."""
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise HydraliError(f"pipeline.recipe={path} cannot be imported: {err}") from err


def make_pipeline(recipe_path: str, *, batch_size: int, num_threads: int, device_id: int | None, seed: int,
                  prefetch_queue_depth: int, **recipe_args):
    """An unbuilt DALI Pipeline from the recipe; arguments the recipe does not declare are left out."""
    recipe = load_recipe(recipe_path)
    declared = inspect.signature(recipe).parameters
    args = {k: v for k, v in recipe_args.items() if k in declared}
    return recipe(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
                  prefetch_queue_depth=prefetch_queue_depth, **args)
