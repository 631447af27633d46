"""What every section of one benchmark run shares: its settings, the command line's overrides, the machine, the
report and the worker process; hydrali's configs composed as `hydrali` composes them (conf/bench.yaml, i.e.
conf/config.yaml and the command line's overrides, plus the section's own) and checked as a run checks them; the
measurements several sections time (a network's upper bound, a whole hydrali training on either backend); and the
rules that record a row as skipped, with the reason, where the machine lacks what it needs (a GPU, TensorFlow).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from hydrali.bench.machine import Machine
from hydrali.bench.report import Report, Row
from hydrali.bench.worker import Remote, Worker
from hydrali.core.errors import HydraliError
from hydrali.core.policies import auto_settings
from hydrali.core.run.run_dir import override_key

# the command line's keys that the sections of another task or experiment (5: task=detection, 7: experiment=cifar10,
# 8: the sweep's own overrides) take too; its classification keys (data, model, batch) they do not
TASK_NEUTRAL_KEYS = (
    "pipeline.num_threads",
    "pipeline.hw_decoder_load",
    "pipeline.device",
    "pipeline.prefetch_queue_depth",
    "seed",
    "paths.",
)
BENCH_KEYS = "bench"  # the command line's keys of the benchmark itself, never handed to hydrali
RUNS_FOLDER = "runs"  # the folder, in the benchmark's run dir, of the training rows' hydrali runs
NO_TENSORFLOW = "needs TensorFlow and DALI's TF plugin"
INSTALL_KERAS = f"{NO_TENSORFLOW} (pip install -e '.[keras]')"
KERAS_LOOPS = "hydrali.bench.keras_loops"  # the worker's module of Keras measurements
TORCH_LAYOUT = "CHW"  # the image layout torch's side reads (the Lightning layer, a plain loop)


def plain(cfg: DictConfig) -> dict:
    """`cfg` resolved into plain data (to hand to a run or to the worker process)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def synthetic_folder(data_dir: str, kind: str, size: DictConfig) -> Path:
    """Where the synthetic `kind` folder ("imagenet", "small") of `size` (classes, train and val images per class)
    lies under `data_dir`."""
    return Path(data_dir) / f"synthetic-{kind}-{size.classes}x{size.train_per_class}x{size.val_per_class}"


class SectionBase:
    """One benchmark run's state and what its sections share: `bench` is the config's bench node, `overrides` the
    command line's hydrali overrides."""

    def __init__(self, bench: DictConfig, overrides: list[str], run_dir: Path, machine: Machine):
        self.bench, self.run_dir, self.machine = bench, run_dir, machine
        self.overrides = [o for o in overrides if not override_key(o).startswith(BENCH_KEYS)]
        self.report = Report()
        self.worker = Worker(bench.keras_library_path)
        self._data: list[str] | None = None

    # --- configs -------------------------------------------------------------------------------------------
    def compose(self, overrides: list[str]) -> DictConfig:
        """hydrali's config for `overrides` (conf/bench.yaml's defaults included), checked as a run checks it, its
        `auto` settings decided for this machine as a run decides them (hydrali.core.policies.auto_settings)."""
        from hydra import compose

        from hydrali.core.config.validate import check_config

        cfg = compose("bench", overrides=overrides)
        with open_dict(cfg):
            del cfg["bench"]
        check_config(cfg)
        auto_settings.resolve(cfg, self.machine.device)
        return cfg

    def classification(self, extra: list[str] = (), drop: tuple[str, ...] = ()) -> DictConfig:
        """The classification config of the command line plus `extra` (keys in `drop` taken from `extra` only);
        the bundled digits are replaced by the synthetic ImageNet-like folder."""
        mine = [o for o in self.overrides if override_key(o) not in drop]
        if self._data is None:
            self._data = []
            cfg = self.compose(mine)
            if cfg.data.name == "digits":
                self._data = self.synthetic_imagenet(cfg.paths.data_dir, self.bench.synthetic)
        return self.compose([*extra, *mine, *self._data])

    def task_neutral_overrides(self) -> list[str]:
        """The command line's overrides that another task or experiment takes too (TASK_NEUTRAL_KEYS)."""
        return [o for o in self.overrides if override_key(o).startswith(TASK_NEUTRAL_KEYS)]

    @staticmethod
    def synthetic_imagenet(data_dir: str, size: DictConfig) -> list[str]:
        """The data overrides of the synthetic ImageNet-like folder of `size` under `data_dir` (written there once)."""
        from hydrali.bench.synthetic import write_synthetic

        root = synthetic_folder(data_dir, "imagenet", size)
        write_synthetic(root, size.classes, size.train_per_class, size.val_per_class)
        return ["data=imagefolder", f"data.root={root}"]

    def small_synthetic(self, data_dir: str) -> str:
        """The synthetic CIFAR-like folder of bench.small.synthetic under `data_dir` (written there once)."""
        from hydrali.bench.synthetic import write_small_synthetic

        size = self.bench.small.synthetic
        return str(write_small_synthetic(synthetic_folder(data_dir, "small", size), **size))

    @staticmethod
    def task_and_data(cfg: DictConfig):
        """The task object and its scanned dataset (files not verified: the benchmark reads them at once)."""
        from hydra.utils import instantiate

        task = instantiate(cfg.task)
        return task, task.prepare_data(cfg.data, verify="off")

    # --- rows ----------------------------------------------------------------------------------------------
    def _add(self, pairs: list, row: Row, measurement) -> Row:
        """`row` in the report (the one already there under its key, if any), its measurement queued in `pairs`
        when it is new."""
        row, new = self.report.add(row)
        if new:
            pairs.append((row, measurement))
        return row

    def _needs_gpu(self, section: str, label: str) -> bool:
        """Whether `label`'s rows of `section` are skipped (recorded so) for want of a GPU."""
        if self.machine.gpus:
            return False
        self.report.skip(section, label, f"needs a GPU ({self.machine.no_gpu})")
        return True

    def _needs_tensorflow(self, section: str, label: str, reason: str = INSTALL_KERAS) -> bool:
        """Whether `label`'s rows of `section` are skipped (recorded so, with `reason`) for want of TensorFlow."""
        if self.machine.tensorflow:
            return False
        self.report.skip(section, label, reason)
        return True

    def _check_steps(
        self, cfg: DictConfig, dataset, where: str = "train", more: str = "bench.synthetic.train_per_class"
    ) -> None:
        """Fail, naming the settings, when an epoch of `dataset` holds fewer steps than bench.<where>'s warm-up and
        timed steps (`more`: where more images come from)."""
        from hydrali.bench.loaders import one_replica_plan

        t = self.bench[where]
        steps = one_replica_plan(cfg, dataset, "cpu").epoch.train_steps
        if steps < t.warmup + t.steps:
            raise HydraliError(
                f"an epoch of {dataset.num_train} images at batch {cfg.data.batch_size} has {steps} "
                f"steps, fewer than bench.{where}.warmup + bench.{where}.steps = {t.warmup + t.steps}: "
                f"give it more images ({more}) or lower those"
            )

    @staticmethod
    def training_label(cfg: DictConfig, variant: str) -> str:
        """How a training row names its network and settings: the variant as typed (or "defaults") and what the
        precision and compile settings became on this machine."""
        network = f"{cfg.model._target_.rpartition('.')[2]} {cfg.model.get('layers', '') or ''}".strip()
        compiled = "compiled" if cfg.backend.compile else "eager"
        return f"{network} [{variant or 'defaults'}: {cfg.backend.precision}, {compiled}], batch {cfg.data.batch_size}"

    # --- measurements several sections time ----------------------------------------------------------------
    def loader_counts(self) -> dict:
        """A loader measurement's warm-up and timed batches (bench.warmup, bench.batches)."""
        return dict(warmup=self.bench.warmup, batches=self.bench.batches)

    def step_counts(self, where: str = "train") -> dict:
        """A training measurement's warm-up and timed steps (bench.<where>.warmup, bench.<where>.steps)."""
        return dict(warmup=self.bench[where].warmup, steps=self.bench[where].steps)

    @staticmethod
    def torch_loop(task, cfg: DictConfig, dataset, feed: str, steps: dict):
        """A plain PyTorch loop of `cfg`'s network on one GPU, fed `feed` ("tensors": one batch already on the GPU,
        the upper bound; "dali": the task's DALI pipeline)."""
        from hydrali.bench.loaders import one_replica_plan
        from hydrali.bench.torch_loops import TorchLoop

        return TorchLoop(task, cfg, dataset, one_replica_plan(cfg, dataset, "gpu"), feed, **steps)

    def _torch_bound_row(
        self, pairs: list, section: str, key: str, what: str, task, cfg: DictConfig, dataset, steps: dict, short: str
    ) -> Row:
        """The row of `section` timing a plain PyTorch loop of `cfg`'s network on GPU tensors (`what`: the network
        and settings): a torch row's upper bound."""
        return self._add(
            pairs,
            Row(section, key, f"{what}: plain loop on GPU tensors (upper bound)", "gpu", short=short),
            self.torch_loop(task, cfg, dataset, "tensors", steps),
        )

    def lightning_training(self, cfg: DictConfig, name: str, steps: dict):
        """A whole hydrali run of `cfg` (the Lightning backend), in this process, named `name` in the run dir."""
        from hydrali.bench.training import HydraliTraining

        return HydraliTraining(plain(cfg), name, str(self.run_dir / RUNS_FOLDER), **steps)

    def keras_training(self, cfg: DictConfig, name: str, steps: dict) -> Remote:
        """A whole hydrali run of `cfg` (the Keras backend), in the worker process, named `name` in the run dir."""
        return Remote(
            self.worker,
            f"{KERAS_LOOPS}.hydrali_training",
            cfg=plain(cfg),
            name=name,
            run_dir=str(self.run_dir / RUNS_FOLDER),
            **steps,
        )

    def keras_bound(self, cfg: DictConfig, steps: dict, **feed) -> Remote:
        """Keras' own train step of `cfg`'s network, in the worker process: on one batch already on the GPU (the
        upper bound), or as `feed` says (feed="dali", per_call=<steps per call>)."""
        return Remote(self.worker, f"{KERAS_LOOPS}.keras_bound", cfg=plain(cfg), **feed, **steps)
