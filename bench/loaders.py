"""What `hydrali-bench` times of the classification loaders (sections 1 and 4): each is a measurement whose
`once()` reads warm-up batches, then times `batches` batches and returns their Timing (images/s).

- RawDali: the recipe's DALI pipeline, `pipeline.run()` (the same operators, no framework plugin);
- LightningLayer: hydrali's Lightning data layer (the backend's loader over DALIGenericIterator);
- KerasLayer: the Keras backend's DALIDataset, read by a tf.function as Keras' train step reads it;
- PilLoader: a torch DataLoader whose worker processes do the recipe's work with PIL (the usual PyTorch loader).
"""

from __future__ import annotations

from functools import cached_property

from omegaconf import DictConfig, OmegaConf, open_dict

from hydrali.bench.timing import Timing, time_steps
from hydrali.core.distributed.topology import detect_topology
from hydrali.core.run.plan import Plan, plan_run


def one_replica_plan(cfg: DictConfig, dataset, device: str) -> Plan:
    """The plan of one replica on this machine (no launcher), DALI on `device`, with its epoch steps."""
    seed = cfg.seed if cfg.seed is not None else 0
    return plan_run(cfg, detect_topology(1, 1, env={}), dataset, seed=seed, device=device)


def with_threads(cfg: DictConfig, threads: int) -> DictConfig:
    """A copy of `cfg` whose DALI pipelines use `threads` CPU threads."""
    out = cfg.copy()
    with open_dict(out):
        out.pipeline.num_threads = threads
    return out


class RawDali:
    """The task's training pipeline itself: pipe.run(), outputs left in DALI."""

    def __init__(self, task, cfg: DictConfig, dataset, device: str, layout: str, warmup: int, batches: int):
        self.task, self.cfg, self.dataset, self.device, self.layout = task, cfg, dataset, device, layout
        self.warmup, self.batches = warmup, batches

    @cached_property
    def pipe(self):
        plan = one_replica_plan(self.cfg, self.dataset, self.device)
        pipe = self.task.build_pipeline(
            pipeline=self.cfg.pipeline,
            data=self.cfg.data,
            model=self.cfg.model,
            dataset=self.dataset,
            plan=plan,
            shard=plan.shard,
            layout=self.layout,
            is_training=True,
        )
        pipe.build()
        return pipe

    def once(self) -> Timing:
        """The Timing (images/s) of pipe.run() (on the GPU: until the last batch's images are computed)."""
        pipe = self.pipe
        sync = (lambda out: out[0][0].as_cpu()) if self.device == "gpu" else (lambda out: None)
        return time_steps(
            pipe.run, warmup=self.warmup, steps=self.batches, images_per_step=pipe.max_batch_size, sync=sync
        )

    def close(self) -> None:
        """Free the pipeline."""
        self.__dict__.pop("pipe", None)


class LightningLayer:
    """hydrali's Lightning data layer: the backend's train loader of the shard (backends/torch/loaders.py
    dali_loader, as DaliDataModule builds it; torch tensors, on the GPU with gpu)."""

    def __init__(self, task, cfg: DictConfig, dataset, device: str, warmup: int, batches: int):
        self.task, self.cfg, self.dataset, self.device = task, cfg, dataset, device
        self.warmup, self.batches = warmup, batches
        self._stream = None

    def _batches(self, loader):
        while True:
            yield from loader

    def once(self) -> Timing:
        """The Timing (images/s) of the loader Lightning trains from (CUDA synchronized)."""
        import torch

        from hydrali.backends.torch.loaders import dali_loader
        from hydrali.bench.torch_loops import probe_contract

        if self._stream is None:
            plan = one_replica_plan(self.cfg, self.dataset, self.device)
            self._stream = self._batches(
                dali_loader(
                    task=self.task, contract=probe_contract(self.cfg, plan), dataset=self.dataset, is_training=True
                )
            )
        sync = (lambda out: torch.cuda.synchronize()) if self.device == "gpu" else (lambda out: None)
        return time_steps(
            lambda: next(self._stream),
            warmup=self.warmup,
            steps=self.batches,
            images_per_step=self.cfg.data.batch_size,
            sync=sync,
        )

    def close(self) -> None:
        """Free the pipeline."""
        self._stream = None


class KerasLayer:
    """The Keras backend's data layer: its DALIDataset of the shard, placed and distributed as the backend places
    it (backends/keras/data.py, strategy.py), each batch pulled inside a tf.function on the replica's device (as
    Keras' train function pulls it); DALI on `device`."""

    def __init__(self, task, cfg: DictConfig, dataset, device: str, warmup: int, batches: int):
        self.task, self.cfg, self.dataset, self.device = task, cfg, dataset, device
        self.warmup, self.batches = warmup, batches
        self._pull = None

    def once(self) -> Timing:
        """The Timing (images/s) of the DALIDataset Keras trains from (the last batch fetched before the clock
        stops)."""
        import tensorflow as tf

        from hydrali.backends.keras.data import dali_dataset, distribute
        from hydrali.backends.keras.strategy import make_strategy, placement, replica_devices, training_device
        from hydrali.core.run.contract import contract_on_device

        if self._pull is None:
            plan = one_replica_plan(self.cfg, self.dataset, self.device)
            contract = contract_on_device(self.cfg, plan, training_device())
            devices = replica_devices(plan)
            data = distribute(
                make_strategy(devices),
                devices,
                plan.device,
                lambda replica: dali_dataset(
                    task=self.task, contract=contract, dataset=self.dataset, replica=replica, is_training=True
                ),
            )
            with placement(devices):  # as Keras' fit iterates it
                iterator = iter(data)

            @tf.function
            def pull():
                images, _ = next(iterator)
                return images[0, 0, 0, 0]

            self._pull = (pull, iterator, data, devices)
        pull, devices = self._pull[0], self._pull[3]
        with placement(devices):
            return time_steps(
                pull,
                warmup=self.warmup,
                steps=self.batches,
                images_per_step=self.cfg.data.batch_size,
                sync=lambda out: out.numpy(),
            )

    def close(self) -> None:
        """Free the dataset."""
        self._pull = None


class PilLoader:
    """The usual PyTorch loader: a DataLoader with `workers` processes doing the recipe's work with PIL.

    Each repeat starts its workers afresh (so that batches prepared while other loaders ran are not counted),
    reads max(warmup, workers) batches (one round of the workers), then times max(batches, 2 x workers)."""

    def __init__(self, files: list[str], cfg: DictConfig, recipe: str, workers: int, warmup: int, batches: int):
        self.files, self.size, self.batch = files, cfg.data.image_size, cfg.data.batch_size
        self.options = OmegaConf.to_container(cfg.pipeline.options, resolve=True)
        self.recipe, self.workers, self.warmup, self.batches = recipe, workers, warmup, batches
        self._repeat = 0

    def once(self) -> Timing:
        """The Timing (images/s) of one fresh DataLoader epoch stream."""
        import torch
        from torch.utils.data import DataLoader

        from hydrali.bench.synthetic import PilTrainingSet

        self._repeat += 1
        dataset = PilTrainingSet(self.files, self.size, seed=self._repeat, recipe=self.recipe, options=self.options)
        loader = DataLoader(
            dataset,
            batch_size=self.batch,
            shuffle=True,
            num_workers=self.workers,
            drop_last=True,
            generator=torch.Generator().manual_seed(self._repeat),
        )

        def batches_forever():
            while True:
                yield from loader

        stream = batches_forever()
        try:
            return time_steps(
                lambda: next(stream),
                warmup=max(self.warmup, self.workers),
                steps=max(self.batches, 2 * self.workers),
                images_per_step=self.batch,
            )
        finally:
            stream.close()  # ends the workers now, not while the next loader is timed
