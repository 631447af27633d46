"""The benchmark's sections: which rows each measures, against which baselines, in which configs.

Every section composes hydrali's config the way `hydrali` would (conf/bench.yaml, i.e. conf/config.yaml and
the command line's overrides, plus the section's own) and checks it as a run would. Rows that need what the
machine lacks (a GPU, TensorFlow) are recorded as skipped, with the reason, never left out.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from hydrali.bench.report import Report, Row
from hydrali.bench.timing import interleave
from hydrali.bench.worker import Remote, Worker
from hydrali.core.contracts.backend import TrainingDevice
from hydrali.core.errors import HydraliError
from hydrali.core.run import auto_settings

# the command line's keys that sections 5 (task=detection) and 7 (small: experiment=cifar10) take too; its
# classification keys (data, model, batch) they do not
DETECTION_KEEPS = (
    "pipeline.num_threads",
    "pipeline.hw_decoder_load",
    "pipeline.device",
    "pipeline.prefetch_queue_depth",
    "seed",
    "paths.",
)


@dataclass(frozen=True)
class Machine:
    """What this machine offers the benchmark."""

    cores: int
    gpus: int  # CUDA devices DALI and torch can both use
    no_gpu: str  # why there is none ("" when there is one)
    tensorflow: bool  # TensorFlow and DALI's TensorFlow plugin installed
    device: TrainingDevice  # what training runs on (torch's view; the `auto` settings are decided for it)


def detect_machine() -> Machine:
    """Cores, usable GPUs (DALI's and torch's view) and whether the Keras side is installed."""
    import torch

    from hydrali.backends.torch.device import training_device_of
    from hydrali.core.data.devices import dali_cuda_devices

    dali, why = dali_cuda_devices()
    if dali and not torch.cuda.is_available():
        dali, why = 0, "torch sees no CUDA device"
    try:
        tf = (
            importlib.util.find_spec("tensorflow") is not None
            and importlib.util.find_spec("nvidia.dali.plugin.tf") is not None
        )
    except (ImportError, ValueError):
        tf = False
    device = training_device_of(torch.device("cuda", 0) if dali else torch.device("cpu"))
    return Machine(cores=os.cpu_count() or 1, gpus=dali, no_gpu=why, tensorflow=tf, device=device)


def override_key(override: str) -> str:
    """The key an override sets (`+a.b=1` -> `a.b`)."""
    return override.lstrip("+~").split("=", 1)[0]


def plain(cfg: DictConfig) -> dict:
    """`cfg` resolved into plain data (to hand to a run or to the worker process)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


class Bench:
    """One benchmark run: `bench` is the config's bench node, `overrides` the command line's hydrali overrides."""

    def __init__(self, bench: DictConfig, overrides: list[str], run_dir: Path, machine: Machine):
        self.bench, self.run_dir, self.machine = bench, run_dir, machine
        self.overrides = [o for o in overrides if not override_key(o).startswith("bench")]
        self.report = Report()
        self.worker = Worker(bench.keras_library_path)
        self._data: list[str] | None = None
        self._compiled_lightning: list[str] = []  # keys of section 2's compiled hydrali rows (section 3 compares)

    # --- configs -------------------------------------------------------------------------------------------
    def compose(self, overrides: list[str]) -> DictConfig:
        """hydrali's config for `overrides` (conf/bench.yaml's defaults included), checked as a run checks it, its
        `auto` settings decided for this machine as a run decides them (hydrali.core.run.auto_settings)."""
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
                from hydrali.bench.synthetic import write_synthetic

                s = self.bench.synthetic
                root = (
                    Path(cfg.paths.data_dir) / f"synthetic-imagenet-{s.classes}x{s.train_per_class}x{s.val_per_class}"
                )
                write_synthetic(root, s.classes, s.train_per_class, s.val_per_class)
                self._data = ["data=imagefolder", f"data.root={root}"]
        return self.compose([*extra, *mine, *self._data])

    @staticmethod
    def task_and_data(cfg: DictConfig):
        """The task object and its scanned dataset (files not verified: the benchmark reads them at once)."""
        from hydra.utils import instantiate

        task = instantiate(cfg.task)
        return task, task.prepare_data(cfg.data, verify="off")

    # --- sections ------------------------------------------------------------------------------------------
    def run(self) -> Report:
        """Measure every configured section, in order (1 and 4 together: they share their baselines)."""
        sections = [str(s) for s in self.bench.sections]
        for key in ("train", "small"):
            warmup = self.bench[key].warmup
            if warmup < 1:
                raise HydraliError(
                    f"bench.{key}.warmup={warmup}: a training run's timer starts after a warm-up step, so it "
                    f"needs at least 1"
                )
        try:
            if "loaders" in sections or "cpu" in sections:
                self.loaders(sections)
            for name in ("lightning", "keras", "detection", "scaling", "small", "sweep"):
                if name in sections:
                    getattr(self, name)()
        finally:
            self.worker.stop()
        return self.report

    def _add(self, pairs: list, row: Row, measurement) -> Row:
        row, new = self.report.add(row)
        if new:
            pairs.append((row, measurement))
        return row

    def loaders(self, sections: list[str]) -> None:
        """1: each recipe through hydrali's data layers, against raw DALI and the PIL DataLoader;
        4: DALI's CPU operators against the PIL DataLoader on the same cores."""
        from hydrali.bench.loaders import LightningLayer, PilLoader, RawDali, with_threads
        from hydrali.core.data.devices import resolve_device

        b, pairs = self.bench, []
        workers = b.workers or self.machine.cores
        for recipe in b.recipes:
            cfg = self.classification([f"pipeline={recipe}"], drop=("pipeline",))
            task, dataset = self.task_and_data(cfg)
            if not hasattr(dataset, "train_dir"):  # shards (data=webdataset): no image files for the PIL baseline
                for section in sections:
                    self.report.skip(section, f"{recipe} recipe through the data layers", "needs an image folder")
                continue
            files = sorted(str(p) for p in Path(dataset.train_dir).glob("*/*"))
            loader = dict(warmup=b.warmup, batches=b.batches)
            if "loaders" in sections:
                device = resolve_device(str(cfg.pipeline.device), self.machine.gpus)
                threads = cfg.pipeline.num_threads
                pil = self._add(
                    pairs,
                    Row(
                        "loaders",
                        f"pil/{recipe}/{workers}",
                        f"PIL DataLoader ({recipe}), {workers} workers",
                        "cpu",
                        short="PIL",
                    ),
                    PilLoader(files, cfg, recipe, workers, **loader),
                )
                raw = self._add(
                    pairs,
                    Row(
                        "loaders",
                        f"raw/{recipe}/{device}/{threads}/CHW",
                        f"raw DALI {recipe} (CHW), {threads} threads",
                        device,
                        (pil.key,),
                        short="raw DALI",
                    ),
                    RawDali(task, cfg, dataset, device, "CHW", **loader),
                )
                if "lightning" in b.layers:
                    self._add(
                        pairs,
                        Row(
                            "loaders",
                            f"layer/lightning/{recipe}/{device}",
                            f"hydrali data layer, Lightning ({recipe})",
                            device,
                            (raw.key, pil.key),
                        ),
                        LightningLayer(task, cfg, dataset, device, **loader),
                    )
                if "keras" in b.layers:
                    if not self.machine.tensorflow:
                        self.report.skip(
                            "loaders",
                            f"hydrali data layer, Keras ({recipe})",
                            "needs TensorFlow and DALI's TF plugin (pip install -e '.[keras]')",
                        )
                    else:
                        raw_hwc = self._add(
                            pairs,
                            Row(
                                "loaders",
                                f"raw/{recipe}/{device}/{threads}/HWC",
                                f"raw DALI {recipe} (HWC), {threads} threads",
                                device,
                                (pil.key,),
                                short="raw DALI HWC",
                            ),
                            RawDali(task, cfg, dataset, device, "HWC", **loader),
                        )
                        self._add(
                            pairs,
                            Row(
                                "loaders",
                                f"layer/keras/{recipe}/{device}",
                                f"hydrali data layer, Keras ({recipe})",
                                device,
                                (raw_hwc.key, pil.key),
                            ),
                            Remote(
                                self.worker,
                                "hydrali.bench.keras_loops.keras_layer",
                                cfg=plain(cfg),
                                device=device,
                                **loader,
                            ),
                        )
            if "cpu" in sections:
                cores = b.cpu_threads or self.machine.cores
                pil = self._add(
                    pairs,
                    Row(
                        "cpu",
                        f"pil/{recipe}/{cores}",
                        f"PIL DataLoader ({recipe}), {cores} workers",
                        "cpu",
                        short="PIL",
                    ),
                    PilLoader(files, cfg, recipe, cores, **loader),
                )
                self._add(
                    pairs,
                    Row(
                        "cpu",
                        f"raw/{recipe}/cpu/{cores}/CHW",
                        f"raw DALI {recipe} (CHW), {cores} threads",
                        "cpu",
                        (pil.key,),
                        short="raw DALI",
                    ),
                    RawDali(task, with_threads(cfg, cores), dataset, "cpu", "CHW", **loader),
                )
        interleave(pairs, b.repeats)

    def _needs_gpu(self, section: str, label: str) -> bool:
        if self.machine.gpus:
            return False
        self.report.skip(section, label, f"needs a GPU ({self.machine.no_gpu})")
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

    def lightning(self) -> None:
        """2: the network through the Lightning backend, against its upper bound (batches already on the GPU)
        and a plain PyTorch loop fed by the same DALI pipeline, per configured variant."""
        if self._needs_gpu("lightning", "training through the Lightning backend, upper bound, plain loop"):
            return
        from hydrali.bench.loaders import one_replica_plan
        from hydrali.bench.torch_loops import TorchLoop
        from hydrali.bench.training import HydraliTraining

        t, pairs = self.bench.train, []
        steps = dict(warmup=t.warmup, steps=t.steps)
        for index, variant in enumerate(t.lightning):
            cfg = self.classification([*t.overrides, *variant.split()])
            task, dataset = self.task_and_data(cfg)
            self._check_steps(cfg, dataset)
            plan = one_replica_plan(cfg, dataset, "gpu")
            what = self.training_label(cfg, variant)
            bound = self._add(
                pairs,
                Row(
                    "lightning",
                    f"train/torch/bound/{variant}",
                    f"{what}: plain loop on GPU tensors (upper bound)",
                    "gpu",
                    short="upper bound",
                ),
                TorchLoop(task, cfg, dataset, plan, "tensors", **steps),
            )
            loop = self._add(
                pairs,
                Row(
                    "lightning",
                    f"train/torch/dali/{variant}",
                    f"{what}: plain PyTorch loop fed by DALI",
                    "gpu",
                    (bound.key,),
                    short="plain loop",
                ),
                TorchLoop(task, cfg, dataset, plan, "dali", **steps),
            )
            self._add(
                pairs,
                Row(
                    "lightning",
                    f"train/lightning/{variant}",
                    f"{what}: hydrali, Lightning backend",
                    "gpu",
                    (bound.key, loop.key),
                    short=f"Lightning {'compiled' if cfg.backend.compile else 'eager'}",
                ),
                HydraliTraining(plain(cfg), f"lightning{index}", str(self.run_dir / "runs"), **steps),
            )
            if cfg.backend.compile:
                self._compiled_lightning.append(f"train/lightning/{variant}")
        interleave(pairs, self.bench.repeats)

    def keras(self) -> None:
        """3: the network through the Keras backend against Keras' own upper bound, per configured variant."""
        if self._needs_gpu("keras", "training through the Keras backend, Keras' upper bound"):
            return
        if not self.machine.tensorflow:
            self.report.skip(
                "keras",
                "training through the Keras backend",
                "needs TensorFlow and DALI's TF plugin (pip install -e '.[keras]')",
            )
            return
        t, pairs = self.bench.train, []
        for index, variant in enumerate(t.keras):
            cfg = self.classification([*t.overrides, "backend=keras", *variant.split()])
            self._check_steps(cfg, self.task_and_data(cfg)[1])
            what = self.training_label(cfg, variant)
            steps = dict(warmup=t.warmup, steps=t.steps)
            bound = self._add(
                pairs,
                Row(
                    "keras",
                    f"train/keras/bound/{variant}",
                    f"{what}: Keras train_step on GPU tensors (upper bound)",
                    "gpu",
                    short="Keras bound",
                ),
                Remote(self.worker, "hydrali.bench.keras_loops.keras_bound", cfg=plain(cfg), **steps),
            )
            for per_call in t.keras_loops:  # the same train step fed by the DALIDataset, as fit() runs it
                self._add(
                    pairs,
                    Row(
                        "keras",
                        f"train/keras/dali/{per_call}/{variant}",
                        f"{what}: plain Keras loop fed by DALI, {per_call} step(s) per call",
                        "gpu",
                        (bound.key,),
                        short=f"plain Keras loop ({per_call} per call)",
                    ),
                    Remote(
                        self.worker,
                        "hydrali.bench.keras_loops.keras_bound",
                        cfg=plain(cfg),
                        feed="dali",
                        per_call=per_call,
                        **steps,
                    ),
                )
            self._add(
                pairs,
                Row(
                    "keras",
                    f"train/keras/{variant}",
                    f"{what}: hydrali, Keras backend",
                    "gpu",
                    (bound.key, *self._compiled_lightning),  # Keras against compiled Lightning, where measured
                ),
                Remote(
                    self.worker,
                    "hydrali.bench.keras_loops.hydrali_training",
                    cfg=plain(cfg),
                    name=f"keras{index}",
                    run_dir=str(self.run_dir / "runs"),
                    **steps,
                ),
            )
        interleave(pairs, self.bench.repeats)

    def detection(self) -> None:
        """5: the ssd recipe alone (DALI, GPU and CPU) and the detector's training on each backend, each against
        its own upper bound (the same network and settings on one batch already on the GPU)."""
        from hydrali.bench.loaders import RawDali, one_replica_plan
        from hydrali.bench.torch_loops import TorchLoop
        from hydrali.bench.training import HydraliTraining

        keep = [o for o in self.overrides if override_key(o).startswith(DETECTION_KEEPS)]
        base = ["task=detection", *self.bench.detection.overrides, *keep]
        cfg = self.compose(base)
        task, dataset = self.task_and_data(cfg)
        b, t, pairs = self.bench, self.bench.train, []
        loader = dict(warmup=b.warmup, batches=b.batches)
        name, threads = cfg.pipeline.name, cfg.pipeline.num_threads
        cpu = self._add(
            pairs,
            Row(
                "detection",
                f"det/raw/{name}/cpu/{threads}",
                f"raw DALI {name}, CPU operators, {threads} threads, batch {cfg.data.batch_size}",
                "cpu",
                short="CPU recipe",
            ),
            RawDali(task, cfg, dataset, "cpu", "CHW", **loader),
        )
        if self._needs_gpu("detection", f"raw DALI {name} mixed decode; detector training on both backends"):
            interleave(pairs, b.repeats)
            return
        gpu = self._add(
            pairs,
            Row(
                "detection",
                f"det/raw/{name}/gpu/{threads}",
                f"raw DALI {name}, mixed decode, {threads} threads, batch {cfg.data.batch_size}",
                "gpu",
                (cpu.key,),
                short="GPU recipe",
            ),
            RawDali(task, cfg, dataset, "gpu", "CHW", **loader),
        )
        self._check_steps(cfg, dataset)
        steps = dict(warmup=t.warmup, steps=t.steps)
        model = cfg.model._target_.rpartition(".")[2]
        light_bound = self._add(
            pairs,
            Row(
                "detection",
                "det/train/lightning/bound",
                f"{self.training_label(cfg, 'lightning')}: plain loop on GPU tensors (upper bound)",
                "gpu",
                short="Lightning bound",
            ),
            TorchLoop(task, cfg, dataset, one_replica_plan(cfg, dataset, "gpu"), "tensors", **steps),
        )
        light = self._add(
            pairs,
            Row(
                "detection",
                "det/train/lightning",
                f"{model} training, hydrali, Lightning",
                "gpu",
                (light_bound.key, gpu.key),
                short="Lightning",
            ),
            HydraliTraining(plain(cfg), "detection-lightning", str(self.run_dir / "runs"), **steps),
        )
        if not self.machine.tensorflow:
            self.report.skip("detection", f"{model} training, hydrali, Keras", "needs TensorFlow and DALI's TF plugin")
        else:
            kcfg = self.compose([*base, "backend=keras"])
            keras_bound = self._add(
                pairs,
                Row(
                    "detection",
                    "det/train/keras/bound",
                    f"{self.training_label(kcfg, 'keras')}: Keras train_step on GPU tensors (upper bound)",
                    "gpu",
                    short="Keras bound",
                ),
                Remote(self.worker, "hydrali.bench.keras_loops.keras_bound", cfg=plain(kcfg), **steps),
            )
            self._add(
                pairs,
                Row(
                    "detection",
                    "det/train/keras",
                    f"{model} training, hydrali, Keras",
                    "gpu",
                    (keras_bound.key, gpu.key, light.key),
                ),
                Remote(
                    self.worker,
                    "hydrali.bench.keras_loops.hydrali_training",
                    cfg=plain(kcfg),
                    name="detection-keras",
                    run_dir=str(self.run_dir / "runs"),
                    **steps,
                ),
            )
        interleave(pairs, b.repeats)

    def scaling(self) -> None:
        """6: whole hydrali runs on 1 GPU and on several (every visible one, or bench.scaling.devices), per
        configured run (a backend and its settings), interleaved; each N-GPU row against its 1-GPU row."""
        from hydrali.bench.scaling import ScalingRun, device_counts
        from hydrali.bench.synthetic import write_synthetic

        s, pairs = self.bench.scaling, []
        requested = [int(n) for n in s.devices]
        if not self.machine.gpus and not requested:
            self.report.skip(
                "scaling",
                "hydrali runs on 1 GPU and on several",
                f"needs a GPU ({self.machine.no_gpu}); bench.scaling.devices=[2] measures CPU replicas",
            )
            return
        counts = device_counts(requested, self.machine.gpus)
        mine = [o for o in self.overrides if not override_key(o).startswith("hydra.")]
        cfg = self.compose(mine)
        data = []
        if cfg.data.name == "digits":  # the bundled digits are too few for several GPUs: a synthetic folder
            size = s.synthetic
            root = Path(cfg.paths.data_dir) / (
                f"synthetic-imagenet-{size.classes}x{size.train_per_class}x{size.val_per_class}"
            )
            write_synthetic(root, size.classes, size.train_per_class, size.val_per_class)
            data = ["data=imagefolder", f"data.root={root}"]
        for index, variant in enumerate(s.runs):
            settings = variant.split()
            keras = any(override_key(o) == "backend" and o.endswith("=keras") for o in settings)
            if keras and not self.machine.tensorflow:
                self.report.skip(
                    "scaling", variant, "needs TensorFlow and DALI's TF plugin (pip install -e '.[keras]')"
                )
                continue
            base = None
            for devices in counts:
                kind = "GPU" if self.machine.gpus else "CPU replica"
                row = self._add(
                    pairs,
                    Row(
                        "scaling",
                        f"scaling/{index}/{devices}",
                        f"{variant} on {devices} {kind}{'s' if devices > 1 else ''}",
                        "gpu" if self.machine.gpus else "cpu",
                        (base.key,) if base is not None else (),
                        short=f"{devices} {kind}",
                    ),
                    ScalingRun(
                        [*s.overrides, *data, *settings, *mine],
                        devices,
                        self.run_dir / "scaling" / f"{index}-{devices}",
                        self.bench.keras_library_path if keras else None,
                    ),
                )
                base = base or row
        interleave(pairs, self.bench.repeats)

    def small_synthetic(self, data_dir: str) -> str:
        """The synthetic CIFAR-like folder of bench.small.synthetic under `data_dir` (written there once)."""
        from hydrali.bench.synthetic import write_small_synthetic

        size = self.bench.small.synthetic
        name = f"synthetic-small-{size.classes}x{size.train_per_class}x{size.val_per_class}"
        return str(write_small_synthetic(Path(data_dir) / name, **size))

    def small_configs(self) -> dict[str, DictConfig]:
        """Section 7's two hydrali configs, by decode_once ("false", "true"): bench.small.overrides (experiment=cifar10)
        with the experiment's own batch and image size, then the command line's pipeline.*, seed and paths.*
        overrides, the Lightning backend, and the photos of bench.small.root or the synthetic folder (written here
        once, under paths.data_dir)."""
        from hydra import compose

        small = self.bench.small
        keep = [o for o in self.overrides if override_key(o).startswith(DETECTION_KEEPS)]
        base = [*small.overrides, *keep]
        # the experiment's batch and image size: conf/bench.yaml's own data.* (ImageNet-like) would win over it
        own = compose("config", overrides=base)
        batch = own.data.get("global_batch") or own.data.batch_size  # one GPU: a fixed global batch is its batch
        base = [*base, f"data.batch_size={batch}", "data.global_batch=null", f"data.image_size={own.data.image_size}"]
        root = small.root if small.root is not None else self.small_synthetic(own.paths.data_dir)
        base = [*base, "data=imagefolder", f"data.root={root}", "backend=lightning"]
        return {once: self.compose([*base, f"pipeline.options.decode_once={once}"]) for once in ("false", "true")}

    def small(self) -> None:
        """7: 32 x 32 photos through the Lightning backend (bench.small.overrides: experiment=cifar10, its network,
        recipe and batch), read from the files every epoch and decoded once into memory (pipeline.options.decode_once),
        against the network's upper bound (its steps on one batch already on the GPU). The photos: bench.small.root,
        or a synthetic CIFAR-like folder written once under paths.data_dir.

        On the GPU machine, after ../shared/device/stage-wheels, from the repository root (bench/gpu/small.sh sources
        bench/gpu/env.sh, runs this section alone with the given overrides and prints its table):

            bash bench/gpu/small.sh                                     # the synthetic folder (bench.small.synthetic)
            bash bench/gpu/small.sh bench.small.root=/tmp/cifar/cifar   # CIFAR-10's JPEG files (.devdata/cifar10.tgz
                                                                        #   carried in the checkout, unpacked there)

        which is, after `source bench/gpu/env.sh`:

            python3 -m hydrali.bench.cli bench.sections=[small] paths.data_dir=/tmp/data [bench.small.root=...]"""
        if self._needs_gpu("small", "32 px training (experiment=cifar10): upper bound, files, decode_once"):
            return
        from hydrali.bench.loaders import one_replica_plan
        from hydrali.bench.torch_loops import TorchLoop
        from hydrali.bench.training import HydraliTraining

        small, pairs = self.bench.small, []
        steps = dict(warmup=small.warmup, steps=small.steps)
        configs = self.small_configs()
        cfg = configs["false"]
        task, dataset = self.task_and_data(cfg)
        more = f"a larger set than bench.small.root={small.root}" if small.root else None
        self._check_steps(cfg, dataset, "small", more or "bench.small.synthetic.train_per_class")
        what = f"{self.training_label(cfg, ' '.join(small.overrides))}, {cfg.data.image_size} px"
        bound = self._add(
            pairs,
            Row("small", "small/bound", f"{what}: plain loop on GPU tensors (upper bound)", "gpu", short="upper bound"),
            TorchLoop(task, cfg, dataset, one_replica_plan(cfg, dataset, "gpu"), "tensors", **steps),
        )
        files = self._add(
            pairs,
            Row(
                "small",
                "small/lightning/files",
                f"{what}: hydrali, Lightning, files read every epoch (decode_once=false)",
                "gpu",
                (bound.key,),
                short="files",
            ),
            HydraliTraining(plain(cfg), "small-files", str(self.run_dir / "runs"), **steps),
        )
        self._add(
            pairs,
            Row(
                "small",
                "small/lightning/decode_once",
                f"{what}: hydrali, Lightning, decoded once into memory (decode_once=true)",
                "gpu",
                (bound.key, files.key),
                short="decode_once",
            ),
            HydraliTraining(plain(configs["true"]), "small-decode-once", str(self.run_dir / "runs"), **steps),
        )
        interleave(pairs, self.bench.repeats)

    def sweep_data(self, overrides: list[str]) -> list[str]:
        """Section 8's data.root override for a sweep of `overrides`: bench.sweep.root's photos, or where the
        overrides' data has no root of its own (experiment=cifar10's data=imagefolder), section 7's synthetic folder
        (written once, under paths.data_dir); none otherwise (e.g. the bundled digits)."""
        from hydra import compose

        from hydrali.core.errors import first_line

        root = self.bench.sweep.root
        if root is None:
            try:
                own = compose(
                    "config", overrides=[o for o in overrides if not override_key(o).startswith(("hydra.", "hydra/"))]
                )
            except Exception as err:  # noqa: BLE001 - Hydra's composition errors have no common type
                raise HydraliError(f"bench.sweep.overrides: {first_line(err)}") from err
            if not OmegaConf.is_missing(own.data, "root"):
                return []
            root = self.small_synthetic(own.paths.data_dir)
        return [f"data.root={root}"]

    def sweep(self) -> None:
        """8: one sweep (bench.sweep.grid over bench.sweep.overrides), each repeat a whole `hydrali -m` command with
        Hydra's basic launcher (the baseline: one job after another, each on every GPU) and one with hydrali's
        launcher (jobs at once, each on bench.sweep.gpus_per_job GPUs), interleaved: each sweep's wall time against
        issue 49's bound, the share of the GPUs' wall time its jobs trained, and each job's best metric on both.
        Without a GPU it sweeps on the CPU when the overrides give the parallel launcher GPU ids
        (hydra.launcher.gpus=[0,1]: G is their count); else it is skipped.

        On the GPU machine, from the repository root, after `source bench/gpu/env.sh`:

            python3 -m hydrali.bench.cli bench.sections=[sweep] paths.data_dir=/tmp/data [bench.sweep.root=...]"""
        from hydrali.bench.sweep import (
            BASIC_LAUNCHER,
            GPUS_PER_JOB_KEY,
            PARALLEL,
            SEQUENTIAL,
            Figures,
            SweepRun,
            given_gpu_ids,
            launcher_only,
        )

        s = self.bench.sweep
        for key in ("gpus_per_job", "repeats"):
            if s[key] < 1:
                raise HydraliError(f"bench.sweep.{key}={s[key]}: give at least 1")
        both, launcher = launcher_only(list(s.overrides))
        ids = given_gpu_ids(launcher)
        if not self.machine.gpus and not ids:
            self.report.skip(
                "sweep",
                f"sweep {s.grid}: one job after another against at once",
                f"needs a GPU ({self.machine.no_gpu}); hydra.launcher.gpus=[0,1] in bench.sweep.overrides sweeps on "
                f"the CPU",
            )
            return
        keep = [o for o in self.overrides if override_key(o).startswith(DETECTION_KEEPS)]
        base = [*both, *keep]
        base += self.sweep_data(base)
        settings = [*base, *s.grid.split()]
        if any(override_key(o) == "backend" and "keras" in o.partition("=")[2] for o in settings):
            if not self.machine.tensorflow:
                self.report.skip(
                    "sweep", f"sweep {s.grid}", "needs TensorFlow and DALI's TF plugin (pip install -e '.[keras]')"
                )
                return
            library = self.bench.keras_library_path
        else:
            library = None
        gpus = len(ids) if ids else self.machine.gpus  # G: the GPUs the sweep may use
        device = "gpu" if self.machine.gpus else "cpu"
        folder = self.run_dir / "sweep"
        sequential = SweepRun(SEQUENTIAL, base, s.grid, [BASIC_LAUNCHER], folder / SEQUENTIAL, gpus, library)
        parallel = SweepRun(
            PARALLEL,
            base,
            s.grid,
            [f"{GPUS_PER_JOB_KEY}={s.gpus_per_job}", *launcher],
            folder / PARALLEL,
            gpus,
            library,
        )
        jobs, pairs = sequential.jobs, []
        baseline = self._add(
            pairs,
            Row(
                "sweep",
                f"sweep/{SEQUENTIAL}",
                f"{jobs} jobs ({s.grid}), hydra/launcher=basic: one after another, each on every GPU",
                device,
                short=SEQUENTIAL,
            ),
            sequential,
        )
        row = self._add(
            pairs,
            Row(
                "sweep",
                f"sweep/{PARALLEL}",
                f"{jobs} jobs ({s.grid}), hydrali's launcher: at once, {s.gpus_per_job} GPU(s) each",
                device,
                (baseline.key,),
                short=PARALLEL,
            ),
            parallel,
        )
        interleave(pairs, s.repeats)
        done = baseline.skipped is None
        for measured, figures in (
            (baseline, Figures(sequential.results, is_baseline=True)),
            (row, Figures(parallel.results, sequential.results if done else None)),
        ):
            if measured.skipped is None:
                measured.notes.update(figures.notes())
                measured.cells = figures.cells()
