"""What every task shares (core.contracts.task.Task): its config fields, the checks after its data is prepared,
how it builds a DALI pipeline from a recipe of conf/pipeline, and what its dataset is when read back from the shards
hydrali convert wrote (`ShardedDataset`). A task says only what differs: where a split's files are read from
(`source`), which files it holds (`image_files`) and what else its recipes take."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf, open_dict

from hydrali.core.contracts.registry import network_key, network_keys
from hydrali.core.contracts.task import FINE_TUNING_KEYS, PREPROCESSING_KEYS, Dataset
from hydrali.core.data import webdataset
from hydrali.core.data.image_files import (
    SKIPPED_FILES,
    BadFiles,
    Verify,
    bad_files_message,
    checked_already_holds,
    find_bad_files,
    verify_files,
)
from hydrali.core.data.pipelines import check_options, make_pipeline
from hydrali.core.errors import HydraliError
from hydrali.core.run.plan import Plan, Shard
from hydrali.core.run.weights_from_run import builder_reads_files, names_a_run

log = logging.getLogger("hydrali")


def network_spec(model_cfg: DictConfig, framework: str) -> DictConfig:
    """What to instantiate for the network on `framework` (the builder its key names: core's network_key, e.g. torch's
    `_target_`), without the settings that are not its builder's (the other frameworks' builders, fine-tuning,
    model.weights but when they are files the builder reads itself)."""
    spec = model_cfg.copy()
    key = network_key(framework)
    with open_dict(spec):
        target = spec.get(key)
        for other in network_keys():
            if other != "_target_":
                spec.pop(other, None)
        for setting in FINE_TUNING_KEYS + PREPROCESSING_KEYS:
            spec.pop(setting, None)
        if target is None:
            raise ValueError(f"model={spec.get('_target_')} has no {key}: it cannot be built on {framework}")
        spec._target_ = target
        weights = spec.get("weights")  # a run's weights: the backend loads them; files: a builder that reads them
        if weights is None or names_a_run(weights) or not builder_reads_files(spec._target_):
            spec.pop("weights", None)
    return spec


def instantiate_network(spec: DictConfig, **arguments: Any) -> Any:
    """The network `spec` (from network_spec) builds with `arguments`; a HydraliError its builder raised (a file
    that cannot be had or read) comes out as itself, not wrapped in Hydra's instantiation error."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(spec, **arguments)
    except InstantiationException as err:
        if isinstance(err.__cause__, HydraliError):
            raise err.__cause__ from None
        raise


def replica_pipeline_args(pipeline: DictConfig, plan: Plan, shard: Shard) -> dict[str, Any]:
    """DALI's Pipeline arguments of one replica's pipeline, whatever its recipe: its batch, worker threads, GPU, seed
    and prefetch queue."""
    return dict(
        batch_size=plan.per_replica_batch,
        num_threads=pipeline.num_threads,
        device_id=shard.device_id,
        seed=shard.pipeline_seed,
        prefetch_queue_depth=pipeline.prefetch_queue_depth,
    )


@dataclass(frozen=True)
class ShardedDataset:
    """A task's dataset read back from the WebDataset shards hydrali convert wrote (hydrali.core.data.webdataset): its
    root and each split's tars; a task's subclass adds what the manifest records about its data."""

    root: str
    train_shards: webdataset.Shards
    val_shards: webdataset.Shards
    # nothing is left out of shards when they are read (bad files were, when they were written)
    skipped: tuple = field(default=(), kw_only=True)

    @property
    def num_train(self) -> int:
        """Training samples."""
        return self.train_shards.samples

    @property
    def num_val(self) -> int:
        """Validation samples."""
        return self.val_shards.samples

    def shard_params(self) -> dict[str, int]:
        """The number of shards of each split, for the run's tracker."""
        return {"dataset/shards_train": len(self.train_shards.paths), "dataset/shards_val": len(self.val_shards.paths)}

    def source(self, shard: Shard, num_shards: int, is_training: bool) -> webdataset.ShardSource:
        """Where one replica's `shard` of a split is read from: its share of the split's tars."""
        shards = self.train_shards if is_training else self.val_shards
        return webdataset.ShardSource.of(self.root, shards, shard.shard_id, num_shards, is_training)


@dataclass(kw_only=True)
class DaliTask:
    """A task fed by DALI recipes; subclasses add their settings and data. Built from the config's `task` node
    (every field given there: the defaults live in the schema and the YAML)."""

    name: str
    monitor: str
    mode: str
    sides: dict[str, str]  # framework -> "module.callable" building that side
    min_classes: ClassVar[int] = 1  # the fewest classes its data may hold (a detector may find one kind of object)

    def image_files(self, dataset: Dataset) -> list[Path]:
        """Every image file of the dataset's splits."""
        raise NotImplementedError

    def source(self, dataset: Dataset, shard: Shard, plan: Plan, is_training: bool) -> Any:
        """Where one replica's shard of one split of a dataset of files (not a ShardedDataset) is read from (the
        recipe's `source`)."""
        raise NotImplementedError

    def recipe_arguments(self, model: DictConfig, data: DictConfig) -> dict[str, Any]:
        """What the task's recipes take beyond the common arguments (none by default)."""
        return {}

    def check_prepared(
        self, data: DictConfig, dataset: Dataset, verify: Verify, classes_in: str
    ) -> list[tuple[Path, str]]:
        """After the data is prepared: data.num_classes agrees with the `classes_in` counted, and the image files
        pass the `verify` check (off, quick or full). A file that fails it stops the run, or with
        data.bad_files=skip is returned (every one, with why) for the task to leave out."""
        if data.num_classes is not None and data.num_classes != dataset.num_classes:
            raise HydraliError(
                f"data.num_classes={data.num_classes} but {classes_in} has {dataset.num_classes}: set "
                f"data.num_classes=null or fix the data"
            )
        if dataset.num_classes < self.min_classes:
            raise HydraliError(
                f"{classes_in} has {dataset.num_classes} class(es) and task={self.name} needs at least "
                f"{self.min_classes}: add the images of the other classes (one folder per class)"
            )
        skip = BadFiles(data.get("bad_files", BadFiles.fail)) is BadFiles.skip
        bad = verify_files(self.image_files(dataset), verify, limit=None if skip else 3)
        if bad and not skip:
            raise HydraliError(
                bad_files_message(bad, ", or pass data.bad_files=skip to train without it (data.verify=off: no check)")
            )
        if bad and not checked_already_holds():  # else the job's process said it
            log.warning(
                "leaving out %d image file(s) that cannot be decoded (data.bad_files=skip), the first %s: %s; "
                "the run dir's %s lists them",
                len(bad),
                bad[0][0],
                bad[0][1],
                SKIPPED_FILES,
            )
        return bad

    def build_pipeline(
        self,
        *,
        pipeline: DictConfig,
        data: DictConfig,
        model: DictConfig,
        dataset: Dataset,
        plan: Plan,
        shard: Shard,
        layout: str,
        is_training: bool,
        checkpointing: bool = False,
        restore: str | None = None,
    ):
        """The DALI pipeline (not yet built) of one replica's shard of one split; with `checkpointing`, one whose
        reader and random state DALI can save (`restore`: a state it saved, to continue from)."""
        options = OmegaConf.to_container(pipeline.options, resolve=True)
        if isinstance(dataset, ShardedDataset):
            source = dataset.source(shard, plan.num_shards, is_training)
        else:
            source = self.source(dataset, shard, plan, is_training)
        if options.get("decode_once"):
            check_options(pipeline.recipe, options)  # before the decoding, which takes seconds
            source = replace(
                source, decoded=self.decoded_batches(source, pipeline=pipeline, data=data, plan=plan, shard=shard)
            )
        return make_pipeline(
            pipeline.recipe,
            options,
            **replica_pipeline_args(pipeline, plan, shard),
            source=source,
            device=plan.device,
            layout=layout,
            image_size=data.image_size,
            dtype=str(pipeline.dtype),
            hw_decoder_load=pipeline.hw_decoder_load,
            checkpointing=checkpointing,
            restore=restore,
            **self.recipe_arguments(model, data),
        )

    def decoded_batches(self, source: Any, *, pipeline: DictConfig, data: DictConfig, plan: Plan, shard: Shard) -> Any:
        """For a recipe whose `decode_once` option is on: the batch source (hydrali.core.data.decoded.DecodedBatches)
        over `source`'s shard decoded once, which the recipe reads in place of the files."""
        raise HydraliError(f"pipeline.options.decode_once=true: task={self.name} cannot decode its images once")

    def explain_decode_error(self, dataset: Dataset) -> str | None:
        """After a decoder failed: one line naming the dataset's image files that cannot be decoded, if any, or for
        shards how to write them again."""
        if isinstance(dataset, ShardedDataset):
            return webdataset.undecodable(dataset.root)
        bad = find_bad_files(self.image_files(dataset), Verify.full)
        return bad_files_message(bad) if bad else None
