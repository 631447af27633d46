"""The classification task, framework-neutral: its data, its DALI pipelines and its output names.

Framework code lives beside it in torch_*.py and keras_*.py, named by the task's config (`task.sides`) and
imported only by the backend that uses it, so that choosing a backend decides which framework is loaded.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf

from hydrali.core.data import affinity, webdataset
from hydrali.core.data.decoded import DecodedBatches, decode_shard, kept_or_decoded
from hydrali.core.data.image_files import Verify
from hydrali.core.data.pipelines import load_recipe
from hydrali.core.errors import HydraliError
from hydrali.core.optim.class_weights import describe, resolve_class_weights
from hydrali.core.run.plan import Plan, Shard
from hydrali.tasks.base import DaliTask, replica_pipeline_args
from hydrali.tasks.classification import sharded
from hydrali.tasks.classification.datasets import ImageFolderInfo, image_files, scan_image_folder, write_digits
from hydrali.tasks.classification.mixing import SOFT_LABEL_DTYPE, mixes
from hydrali.tasks.classification.recipes import FolderSource, square_images
from hydrali.tasks.classification.scoring import ClassificationPredictions, ClassificationScores

log = logging.getLogger("hydrali")


@dataclass(kw_only=True)
class ClassificationTask(DaliTask):
    """Image classification over a folder-per-class dataset; top-1 accuracy, cross-entropy loss. Its settings come
    from the config (conf/task/classification.yaml, its schema: tasks/classification/spec.py)."""

    label_smoothing: float
    min_classes: ClassVar[int] = 2  # a classifier of one class learns nothing (its accuracy is 1 from the start)
    class_weights: Any = None  # null | auto | a list (hydrali.core.optim.class_weights)
    flip_averaging: bool = False  # validation, eval and predict average the network's softmax with the mirror's
    # Learnt from the pipelines built (build_pipeline), for the recipes and output_specs, which the config does not
    # tell: the dataset's number of classes, and whether the training pipeline mixes (its labels soft targets).
    num_classes: int | None = field(default=None, init=False)
    soft_training_labels: bool = field(default=False, init=False)
    # the shards decoded once (pipeline.options.decode_once), by split, shard and what shaped them: decoded at the
    # first pipeline of each, kept for the later ones (a resume's)
    _decoded: dict = field(default_factory=dict, init=False, repr=False)

    def output_names(self, is_training: bool) -> tuple[str, ...]:
        """What the recipes return, in order (the same for both splits)."""
        return ("images", "labels")

    def output_specs(
        self, *, batch: int, image_size: int, image_dtype: str, is_training: bool, model: DictConfig
    ) -> tuple[tuple[tuple[int, ...], str], ...]:
        """(shape, dtype) of each batched output in HWC layout, for frameworks that need them up front (Keras):
        labels are (batch, 1) class indices, or (batch, classes) soft targets from a training pipeline that mixes."""
        images = ((batch, image_size, image_size, 3), image_dtype)
        if is_training and self.soft_training_labels:
            return images, ((batch, self.num_classes), SOFT_LABEL_DTYPE)
        return images, ((batch, 1), "int32")

    def build_pipeline(self, *, pipeline: DictConfig, dataset: ImageFolderInfo, is_training: bool, **settings):
        """The DALI pipeline (not yet built) of one replica's shard of one split (tasks/base.py), its recipe given
        the dataset's number of classes; a training one also tells output_specs whether its labels are soft."""
        self.num_classes = dataset.num_classes
        # a user's own recipe (pipeline.recipe) need not take the number of classes: given only where declared
        self.recipe_takes_classes = "num_classes" in inspect.signature(load_recipe(pipeline.recipe)).parameters
        if is_training:
            self.soft_training_labels = mixes(OmegaConf.to_container(pipeline.options, resolve=True))
        return super().build_pipeline(pipeline=pipeline, dataset=dataset, is_training=is_training, **settings)

    def decoded_batches(
        self, source: Any, *, pipeline: DictConfig, data: DictConfig, plan: Plan, shard: Shard
    ) -> DecodedBatches:
        """The batch source over `source`'s shard decoded once (by recipes.square_images: small_images' own reader,
        decoder, resize and, for training, its padding; the images the files' pipeline of that shard reads), decoded
        at the first call for that split and shard."""
        options = pipeline.options
        pad = {"pad": options.get("pad", 0), "pad_mode": options.get("pad_mode", "reflect")}
        padding = pad if source.is_training else {}  # what small_images pads; a recipe without `pad` gets none
        key = (source.is_training, shard.shard_id, data.image_size, tuple(padding.items()))
        if key not in self._decoded:
            # the shard the files' pipeline of this split reads: for training, DALI's file reader shuffles the whole
            # file list with one fixed seed before sharding it (webdataset shards hold samples `hydrali convert`
            # shuffled when it wrote them, read in their order), so that every replica's shard is a draw of every class
            # (in file order, the shards of class folders hold different classes, and under DDP each replica's
            # BatchNorm statistics told them apart: 0.43 on 2 GPUs where 1 reached 0.917), read here in that order
            # (a shuffle buffer of one: the order does not depend on the pipeline's seed, so a sweep's worker keeps
            # the decoded shard for its next job of another seed); validation in file order, padded, as its
            # pipeline reads the files
            decoder = square_images(
                source=source,
                initial_fill=1,
                device=plan.device,
                image_size=data.image_size,
                hw_decoder_load=pipeline.hw_decoder_load,
                **padding,
                **replica_pipeline_args(pipeline, plan, shard),
                **affinity.dali_arguments(),
            )
            split = "training" if source.is_training else "validation"
            self._decoded[key] = kept_or_decoded(
                (source, data.image_size, tuple(padding.items()), plan.device, pipeline.hw_decoder_load),
                lambda: decode_shard(
                    decoder,
                    shard_id=shard.shard_id,
                    num_shards=plan.num_shards,
                    side=data.image_size + 2 * padding.get("pad", 0),
                    split=split,
                ),
                split,
            )  # fmt: skip
            del decoder
        decoded = self._decoded[key]
        return DecodedBatches(
            decoded, batch=plan.per_replica_batch, seed=shard.pipeline_seed, is_training=source.is_training
        )

    def recipe_arguments(self, model: DictConfig, data: DictConfig) -> dict[str, Any]:
        """The number of classes (the soft labels of mixup and cutmix), to a recipe that declares it."""
        return {"num_classes": self.num_classes} if getattr(self, "recipe_takes_classes", True) else {}

    def prepare_data(self, data: DictConfig, verify: Verify) -> ImageFolderInfo:
        """Make sure the dataset is on disk (writing the bundled one if needed) and scan it; then check its
        image files as much as `verify` says (off, quick or full). Shards (data=webdataset) are read from their
        manifest, their files checked to exist."""
        if data.name == webdataset.FORMAT:
            info = sharded.open_shards(str(data.root))
            self.check_prepared(data, info, Verify.off, classes_in=f"{data.root}/{webdataset.MANIFEST}")
            return self._weighted(info)
        if data.name == "digits":
            write_digits(data.root, size=data.size, val_fraction=data.val_fraction)
        info = scan_image_folder(data.root)
        bad = self.check_prepared(data, info, verify, classes_in=f"{data.root}/train (class folders)")
        info = info.without(bad) if bad else info
        return self._weighted(info)

    def _weighted(self, info):
        """The dataset with the loss's class weights (task.class_weights) resolved from its training counts."""
        weights = resolve_class_weights(self.class_weights, info.train_per_class, info.classes)
        if weights is not None:
            log.info("class weights (task.class_weights=%s): %s", self.class_weights, describe(weights, info.classes))
        return replace(info, class_weights=weights)

    def image_files(self, dataset: ImageFolderInfo) -> list[Path]:
        """Every image file of train/ and val/ (hydrali predict: the files it reads); none for shards."""
        if isinstance(dataset, sharded.ShardedClassification):
            return []
        if dataset.val_files is not None:
            return [dataset.val_dir / name for name in dataset.val_files]
        return image_files([dataset.train_dir, dataset.val_dir])

    def source(self, dataset: ImageFolderInfo, shard: Shard, plan: Plan, is_training: bool) -> FolderSource:
        """The split's class folders (without the files left out), this replica's shard of them."""
        split_dir = dataset.train_dir if is_training else dataset.val_dir
        listed = dataset.listed_files(split_dir)
        files, labels = listed if listed is not None else (None, None)
        return FolderSource(str(split_dir), shard.shard_id, plan.num_shards, is_training, files=files, labels=labels)

    def evaluation_data(self, data: DictConfig, split: str, verify: Verify) -> ImageFolderInfo:
        """The dataset with `split` (val, or test: <data.root>/test/<class>/, the training classes) as the split
        scored by hydrali eval."""
        if split == "val":
            return self.prepare_data(data, verify)
        if data.name == webdataset.FORMAT:
            raise HydraliError(
                f"split={split}: shards hold train and val; score the {split} split from its folder: "
                f"hydrali eval RUN_DIR split={split} data=imagefolder data.root=<the folder holding {split}/>"
            )
        if data.name == "digits":
            write_digits(data.root, size=data.size, val_fraction=data.val_fraction)
        info = scan_image_folder(data.root, val_split=split)
        bad = self.check_prepared(data, info, verify, classes_in=f"{data.root}/train (class folders)")
        return info.without(bad) if bad else info

    def prediction_data(
        self, dataset: ImageFolderInfo, folder: Path, files: list[str], annotations: str | None = None
    ) -> ImageFolderInfo:
        """A dataset whose validation split is `files` (relative to `folder`), with `dataset`'s classes: what
        hydrali predict reads through the validation recipe."""
        if annotations is not None:
            raise HydraliError(f"annotations={annotations}: a COCO file of the images is for task=detection")
        return ImageFolderInfo(
            root=folder,
            classes=dataset.classes,
            num_train=0,
            num_val=len(files),
            val_split=".",
            val_files=tuple(files),
        )  # the classes of the run's data, a folder dataset or shards

    def scores(self, dataset: ImageFolderInfo) -> ClassificationScores:
        """What hydrali eval accumulates over the split's batches (tasks/classification/scoring.py)."""
        return ClassificationScores(dataset.classes)

    def predictions(self, dataset: ImageFolderInfo, top_k: int) -> ClassificationPredictions:
        """What hydrali predict accumulates and writes (predictions.csv)."""
        return ClassificationPredictions(dataset.classes, top_k)

    def shard_samples(self, dataset: ImageFolderInfo, split: str, seed: int | None):
        """(how many, the samples) of `split` as hydrali convert writes them (tasks/classification/sharded.py)."""
        return sharded.samples(dataset, split, seed)

    def shard_facts(self, dataset: ImageFolderInfo) -> dict:
        """What the shards' manifest records about the data: classes and training counts."""
        return sharded.facts(dataset)

    def artifacts(self) -> list:
        """Files the task wrote for the run's tracker: none."""
        return []
