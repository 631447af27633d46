"""The classification task, framework-neutral: its data, its DALI pipelines and its output names.

Framework code lives beside it in torch_*.py and keras_*.py, named by the task's config
(`torch_target`, `keras_target`) and imported only by the backend that uses it, so that choosing a
backend decides which framework is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from hydrali.core.errors import HydraliError
from hydrali.core.data.pipelines import Source, make_pipeline
from hydrali.core.run.plan import Plan, Shard
from hydrali.core.data.image_files import Verify, bad_files_message, find_bad_files, verify_files
from hydrali.tasks.classification.datasets import ImageFolderInfo, image_files, scan_image_folder, write_digits


@dataclass
class ClassificationTask:
    """Image classification over a folder-per-class dataset; top-1 accuracy, cross-entropy loss."""
    name: str
    monitor: str
    mode: str
    torch_target: str = ""     # the callable building the torch side (backend=lightning)
    keras_target: str = ""     # the callable building the Keras side (backend=keras)
    label_smoothing: float = 0.0

    def output_names(self, is_training: bool) -> tuple[str, ...]:
        """What the recipes return, in order (the same for both splits)."""
        return ("images", "labels")

    def output_specs(self, *, batch: int, image_size: int, image_dtype: str, is_training: bool, model: DictConfig
                     ) -> tuple[tuple[tuple[int, ...], str], ...]:
        """(shape, dtype) of each batched output in HWC layout, for frameworks that need them up front (Keras)."""
        return ((batch, image_size, image_size, 3), image_dtype), ((batch, 1), "int32")

    def prepare_data(self, data: DictConfig, verify: Verify) -> ImageFolderInfo:
        """Make sure the dataset is on disk (writing the bundled one if needed) and scan it; then check its
        image files as much as `verify` says (off, quick or full)."""
        if data.name == "digits":
            write_digits(data.root, size=data.size, val_fraction=data.val_fraction)
        info = scan_image_folder(data.root)
        if data.num_classes is not None and data.num_classes != info.num_classes:
            raise HydraliError(f"data.num_classes={data.num_classes} but {data.root}/train has "
                               f"{info.num_classes} class folders: set data.num_classes=null or fix the data")
        bad = verify_files(image_files([info.train_dir, info.val_dir]), verify)
        if bad:
            raise HydraliError(bad_files_message(bad, " (data.verify=off skips this check)"))
        return info

    def build_pipeline(self, *, pipeline: DictConfig, data: DictConfig, model: DictConfig, dataset: ImageFolderInfo,
                       plan: Plan, shard: Shard, layout: str, is_training: bool):
        """The DALI pipeline (not yet built) of one replica's shard of one split."""
        source = Source(str(dataset.train_dir if is_training else dataset.val_dir), shard.shard_id,
                        plan.num_shards, is_training)
        return make_pipeline(
            pipeline.recipe, OmegaConf.to_container(pipeline.options, resolve=True),
            batch_size=plan.per_replica_batch, num_threads=pipeline.num_threads, device_id=shard.device_id,
            seed=shard.pipeline_seed, prefetch_queue_depth=pipeline.prefetch_queue_depth,
            source=source, device=plan.device, layout=layout, image_size=data.image_size,
            dtype=str(pipeline.dtype), hw_decoder_load=pipeline.hw_decoder_load)

    def artifacts(self) -> list:
        """Files the task wrote for the run's tracker: none."""
        return []

    def explain_decode_error(self, dataset: ImageFolderInfo) -> str | None:
        """After a decoder failed: one line naming the files of the dataset that cannot be decoded, if any."""
        bad = find_bad_files(image_files([dataset.train_dir, dataset.val_dir]), Verify.full)
        return bad_files_message(bad) if bad else None
