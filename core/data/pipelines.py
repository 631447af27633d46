"""DALI recipes named in the config (`pipeline.recipe`): the reader conventions they share, their options, building.

A recipe is a `@pipeline_def` function. It receives from core the `Source` it reads (files, shard,
and how the split is read), the device, the layout its backend wants, the image size and output
type, and, as keyword-only parameters, its own options: the keys of `pipeline.options`. An option
the recipe does not declare, or a declared one left unset, is an error naming it. A recipe that declares the
option `decode_once` gets, when it is true, its shard decoded once by the task in `Source.decoded`
(hydrali.core.data.decoded) and reads its batches from there: the classification task decodes with
recipes.square_images (decoded, resized to image_size x image_size, and for training padded by the recipe's `pad`
and `pad_mode` options where it has them), what small_images reads.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from omegaconf import DictConfig

from hydrali.core.data import affinity
from hydrali.core.errors import HydraliError

READER_NAME = "Reader"  # every recipe names its reader so, for iterators and the epoch steps


@dataclass(frozen=True)
class Source:
    """What one pipeline reads: a split's location and this replica's shard of it.

    Training reads an endless, shuffled stream of its own shard (no padding, no epoch boundary: the
    backends take hydrali.core.run.epoch's steps from it). Every reader sticks to its shard: with DALI's
    default (moving to the next shard each pass), the shuffle buffer straddles the shard boundary and
    replicas read some of the same images in the same epoch (seen with fn.readers.coco). Validation reads
    its own shard in order, padded to whole batches (the padding is masked by the epoch steps).
    """

    root: str
    shard_id: int
    num_shards: int
    is_training: bool
    # the shard decoded once (a recipe's `decode_once` option): fn.external_source's batch source
    # (hydrali.core.data.decoded.DecodedBatches) the recipe reads in place of the files; None: read the files
    decoded: Any = None

    def reader_args(self) -> dict:
        """The sharding arguments every DALI reader of a recipe takes (fn.readers.file, fn.readers.coco, ...)."""
        return {
            "shard_id": self.shard_id,
            "num_shards": self.num_shards,
            "random_shuffle": self.is_training,
            "pad_last_batch": not self.is_training,
            "stick_to_shard": True,
            "name": READER_NAME,
        }


def decoder_args(device: str, hw_decoder_load: float) -> dict:
    """The keyword arguments of every recipe's image decoder (fn.decoders.image, image_random_crop, image_slice):
    on the GPU the mixed decoder (nvJPEG, with this share on the hardware decoder), else the CPU one."""
    if device == "gpu":
        return {"device": "mixed", "hw_decoder_load": hw_decoder_load}
    return {"device": "cpu"}


def reading_files(pipeline: DictConfig) -> DictConfig:
    """The pipeline config `pipeline` with its recipe reading the files: `decode_once` off where the recipe has it."""
    if not pipeline.options.get("decode_once", False):
        return pipeline
    files = pipeline.copy()
    files.options.decode_once = False
    return files


def load_recipe(path: str):
    """The @pipeline_def function at import path `path` (e.g. hydrali.tasks.classification.recipes.standard)."""
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise HydraliError(f"pipeline.recipe={path} cannot be imported: {err}") from err


def recipe_options(recipe) -> dict[str, Any]:
    """The options a recipe declares (its keyword-only parameters), with their defaults (empty if none)."""
    params = inspect.signature(recipe).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def check_options(recipe_path: str, options: Mapping[str, Any]) -> None:
    """Fail, naming the key, when `options` has a key the recipe does not declare or lacks one it requires."""
    declared = recipe_options(load_recipe(recipe_path))
    name = recipe_path.rpartition(".")[2]
    unknown = sorted(set(options) - set(declared))
    if unknown:
        raise HydraliError(
            f"pipeline.options.{unknown[0]} is not an option of recipe {name}: "
            f"its options are {', '.join(sorted(declared)) or '(none)'}"
        )
    missing = sorted(k for k, default in declared.items() if default is inspect.Parameter.empty and k not in options)
    if missing:
        raise HydraliError(
            f"recipe {name} needs pipeline.options.{missing[0]}: set it in the pipeline config "
            f"or on the command line (+pipeline.options.{missing[0]}=...)"
        )
    for key, choices in recipe_choices(load_recipe(recipe_path)).items():
        if key in options and options[key] not in choices:
            shown = " | ".join("null" if c is None else str(c) for c in choices)
            raise HydraliError(f"pipeline.options.{key}={options[key]} is not a choice of recipe {name}: pass {shown}")


def recipe_choices(recipe) -> dict[str, tuple]:
    """The options a recipe declares as one of a few values (`Literal[...]`, or `Optional[Literal[...]]`), with
    those values."""
    try:
        hints = typing.get_type_hints(inspect.unwrap(recipe))
    except Exception:  # annotations naming what only a type checker imports: nothing to check
        return {}
    choices = {}
    for key in recipe_options(recipe):
        hint = hints.get(key)
        literals = [hint] if typing.get_origin(hint) is typing.Literal else list(typing.get_args(hint))
        values = tuple(v for h in literals if typing.get_origin(h) is typing.Literal for v in typing.get_args(h))
        if values:
            choices[key] = values + ((None,) if type(None) in typing.get_args(hint) else ())
    return choices


def make_pipeline(
    recipe_path: str,
    options: Mapping[str, Any],
    *,
    batch_size: int,
    num_threads: int,
    device_id: int | None,
    seed: int,
    prefetch_queue_depth: int,
    checkpointing: bool = False,
    restore: str | None = None,
    **inputs,
):
    """An unbuilt DALI Pipeline from the recipe, given core's `inputs` and the recipe's `options`; its worker
    threads pinned as this process decided (hydrali.core.data.affinity). With `checkpointing`, DALI keeps its
    readers' and random operators' state (`restore`: a state saved by such a pipeline, to continue from)."""
    check_options(recipe_path, options)
    recipe = load_recipe(recipe_path)
    try:
        return recipe(
            batch_size=batch_size,
            num_threads=num_threads,
            device_id=device_id,
            seed=seed,
            prefetch_queue_depth=prefetch_queue_depth,
            **affinity.dali_arguments(),
            **({"enable_checkpointing": True, "checkpoint": restore} if checkpointing else {}),
            **inputs,
            **dict(options),
        )
    except (TypeError, ValueError) as err:
        name = recipe_path.rpartition(".")[2]
        raise HydraliError(
            f"recipe {name} cannot be defined with pipeline.options={dict(options)}: {str(err).splitlines()[0]}"
        ) from err
