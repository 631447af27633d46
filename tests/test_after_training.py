"""Using a trained run, on each backend: `hydrali eval` scores its checkpoint as its training did, `hydrali predict`
labels a folder of images through its validation recipe, `hydrali export` writes a model whose own runtime gives the
framework's numbers, beside a DALI pipeline that reproduces the validation inputs; bad input is one line, exit 2,
nothing written. The runs are the session's shared pair (conftest.py: trained_on_both)."""

from __future__ import annotations

import csv
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.support.checks import fails_with
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

BACKENDS = ("lightning", "keras")
VAL_IMAGES = 360  # the digits' validation split
EXPORTS = [("lightning", "onnx"), ("lightning", "torchscript"), ("keras", "saved_model"), ("keras", "onnx")]
MODEL_FILES = {"onnx": "model.onnx", "torchscript": "model.pt", "saved_model": "model"}


def _run_dir(trained, backend: str) -> Path:
    return trained[0] / backend


def _summary(trained, backend: str) -> dict:
    return trained[1 + BACKENDS.index(backend)][1]


def _hydrali(trained, *args: str):
    return run_cli(*args, cwd=trained[0], timeout=600)


def _use(capsys, command: str, *args: str) -> tuple[int, str, str]:
    """`hydrali <command> <args>` in this process (its frameworks are loaded already): (exit code, stdout, stderr)."""
    from hydrali.core.cli.use import run_command

    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        run_command(command, list(args))
    out, err = capsys.readouterr()
    return ended.value.code, out, err


def _refused(result, needle: str) -> None:
    code, _, err = result
    assert code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("hydrali: error:")]
    assert len(errors) == 1 and needle in errors[0], err[-3000:]


@pytest.fixture(scope="module")
def evaluated(trained_on_both):
    """`hydrali eval <run>` on each backend's run: backend -> (its output, its metrics.json)."""
    found = {}
    for backend in BACKENDS:
        out = _hydrali(trained_on_both, "eval", backend)
        assert out.returncode == 0, out.stderr[-3000:]
        found[backend] = out, json.loads((_run_dir(trained_on_both, backend) / "eval/val/metrics.json").read_text())
    return found


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_scores_the_best_checkpoint_as_training_did_with_per_class_figures_that_add_up(
    trained_on_both, evaluated, backend
):
    out, scored = evaluated[backend]
    summary = _summary(trained_on_both, backend)
    acc = scored["metrics"]["val/acc"]
    assert acc == pytest.approx(summary["best"]["val/acc"], abs=1e-4)  # what the framework measured in training
    assert Path(scored["checkpoint"]).name == Path(summary["best_checkpoint"]).name
    matrix = np.array(scored["confusion_matrix"])
    assert matrix.shape == (10, 10) and matrix.sum() == scored["images"] == VAL_IMAGES
    assert np.trace(matrix) / matrix.sum() == pytest.approx(acc, abs=1e-9)
    for k, name in enumerate(scored["classes"]):
        row = scored["per_class"][name]
        assert row["support"] == matrix[k].sum()
        assert row["recall"] == pytest.approx(matrix[k, k] / matrix[k].sum())
        if matrix[:, k].sum():
            assert row["precision"] == pytest.approx(matrix[k, k] / matrix[:, k].sum())
    assert f"val/acc  {acc:.4f}" in out.stdout
    assert (_run_dir(trained_on_both, backend) / "eval/val/confusion_matrix.png").stat().st_size > 0
    client = MlflowClient(f"sqlite:///{trained_on_both[0]}/mlflow.db")
    logged = client.get_run(summary["mlflow_run_id"])
    assert logged.data.metrics["eval/val/acc"] == pytest.approx(acc)
    assert logged.data.metrics["eval/val/recall/3"] == pytest.approx(scored["per_class"]["3"]["recall"])
    assert logged.info.status == "FINISHED"  # the run's status is left as training left it
    artifacts = {Path(a.path).name for a in client.list_artifacts(summary["mlflow_run_id"], "eval/val")}
    assert {"metrics.json", "confusion_matrix.png"} <= artifacts


@pytest.mark.keras
@pytest.mark.parametrize("backend", BACKENDS)
def test_predict_labels_every_image_that_decodes_names_the_one_that_does_not_and_agrees_with_eval(
    trained_on_both, evaluated, data_dir, tmp_path, capsys, backend
):
    folder = tmp_path / "new images"
    shutil.copytree(data_dir / "digits" / "val", folder / "nested")  # one sub-folder per digit, a level down
    broken = folder / "broken.jpg"
    broken.write_bytes((folder / "nested/3").iterdir().__next__().read_bytes()[:300])  # a truncated JPEG
    code, out, err = _use(
        capsys,
        "predict",
        str(_run_dir(trained_on_both, backend)),
        f"source={folder}",
        "top_k=3",
        f"out={tmp_path / 'out'}",
    )
    assert code == 0, err[-3000:]
    with (tmp_path / "out/predictions.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == VAL_IMAGES  # every image but the broken one
    assert str(broken) in out and str(broken) in (tmp_path / "out/skipped_files.txt").read_text()
    assert list(rows[0]) == ["file", "class_1", "score_1", "class_2", "score_2", "class_3", "score_3"]
    assert all(float(r["score_1"]) >= float(r["score_2"]) >= float(r["score_3"]) for r in rows)
    # each row's file is the image its classes were predicted for: the folder names are the true digits
    right = sum(Path(r["file"]).parts[1] == r["class_1"] for r in rows)
    assert right / len(rows) == pytest.approx(evaluated[backend][1]["metrics"]["val/acc"], abs=1e-9)


def _deserialized_batches(path: Path, images: int):
    """The batches of the serialized DALI pipeline at `path`, trimmed to `images` images: each a tuple of its outputs
    (classification: images, labels; detection: images, targets, image ids) as arrays."""
    from nvidia.dali import Pipeline

    pipe = Pipeline.deserialize(filename=str(path))
    pipe.build()
    done = 0
    while done < images:
        outputs = [output.as_array() for output in pipe.run()]
        keep = min(len(outputs[0]), images - done)
        yield tuple(output[:keep] for output in outputs)
        done += keep


def _exported_model(fmt: str, model: Path, names: tuple[str, ...]):
    """A function of a batch of images giving the exported model's outputs `names` (a dict), run by the format's own
    runtime: onnxruntime, TorchScript (outputs in the order of `names`) or TensorFlow."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        fed = session.get_inputs()[0].name
        return lambda images: dict(zip(names, session.run(list(names), {fed: images})))
    if fmt == "torchscript":
        import torch

        program = torch.jit.load(str(model))
        return lambda images: {n: v.detach().numpy() for n, v in zip(names, program(torch.from_numpy(images)))}
    import tensorflow as tf

    serve = tf.saved_model.load(str(model)).signatures["serving_default"]
    return lambda images: {n: v.numpy() for n, v in serve(images=tf.constant(images)).items() if n in names}


def _training_validation_images(run_dir: Path, backend: str):
    """The first validation batch's images as the run's training fed them: its backend's own data layer (Lightning's
    loader, Keras' DALIDataset) over the task's validation pipeline, for one replica."""
    from hydra.utils import instantiate

    from hydrali.core.contracts.backend import TrainingDevice
    from hydrali.core.distributed.topology import Topology
    from hydrali.core.inference.trained_run import open_run
    from hydrali.core.run.contract import contract_on_device
    from hydrali.core.run.plan import plan_run

    cfg = open_run("eval", str(run_dir), []).cfg
    task = instantiate(cfg.task)
    dataset = task.prepare_data(cfg.data, "off")
    plan = plan_run(cfg, Topology(1, 0, 0, 0, 1), dataset, seed=cfg.seed, device="cpu")
    if backend == "lightning":
        from hydrali.backends.torch.loaders import dali_loader

        contract = contract_on_device(cfg, plan, TrainingDevice("cpu", "CPU"))
        loader = dali_loader(task=task, contract=contract, dataset=dataset, is_training=False)
        return next(iter(loader))["images"].numpy()
    from hydrali.backends.keras.data import dali_dataset

    contract = contract_on_device(cfg, plan, TrainingDevice("cpu", "CPU"))
    dataset_of_batches = dali_dataset(task=task, contract=contract, dataset=dataset, replica=0, is_training=False)
    return next(iter(dataset_of_batches))[0].numpy()


@pytest.mark.keras
@pytest.mark.parametrize("backend,fmt", EXPORTS)
def test_the_exported_model_and_pipeline_reproduce_the_runs_validation(
    trained_on_both, evaluated, capsys, backend, fmt
):
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        code, out, err = _use(capsys, "export", str(_run_dir(trained_on_both, backend)), f"format={fmt}")
    assert code == 0, err[-3000:]
    assert "checked on 32 validation images" in out
    # the format asked for by name: no deprecation warning of it (before: torch.jit.trace's, trace_method's, load's)
    assert not [str(w.message) for w in warned if "torch.jit" in str(w.message)]
    folder = _run_dir(trained_on_both, backend) / "export" / fmt
    check = json.loads((folder / "check.json").read_text())
    assert check["result"] == "passed" and check["max_abs_difference"] <= 1e-4 and check["images"] == 32
    expects = json.loads((folder / "preprocessing.json").read_text())
    assert expects["image_size"] == 16 and expects["classes"] == [str(d) for d in range(10)]
    assert expects["layout"] == {"lightning": "NCHW", "keras": "NHWC"}[backend]
    exported = _exported_model(fmt, folder / MODEL_FILES[fmt], ("logits",))
    right = seen = 0
    batches = _deserialized_batches(folder / "dali_pipeline.bin", VAL_IMAGES)
    for images, labels in batches:
        labels = labels.reshape(-1)
        if seen == 0:  # the deserialized pipeline gives the inputs the run's validation had
            np.testing.assert_array_equal(
                images, _training_validation_images(_run_dir(trained_on_both, backend), backend)
            )
        right += int(np.sum(np.argmax(exported(images)["logits"], axis=1) == labels))
        seen += len(labels)
    # the exported model on the deserialized pipeline's inputs scores what the framework measured in training
    assert seen == VAL_IMAGES
    assert right / seen == pytest.approx(_summary(trained_on_both, backend)["best"]["val/acc"], abs=1e-4)


@pytest.mark.keras
def test_eval_of_a_test_split_beside_val_reads_it(trained_on_both, evaluated, data_dir, tmp_path, capsys):
    """split=test reads <data.root>/test/: here a copy of val/, so it scores val's accuracy; data.root is taken from
    the command line over the run's own."""
    root = tmp_path / "digits"
    shutil.copytree(data_dir / "digits", root)
    shutil.copytree(root / "val", root / "test")
    run = _run_dir(trained_on_both, "keras")
    code, out, err = _use(capsys, "eval", str(run), "split=test", f"data.root={root}")
    assert code == 0, err[-3000:]
    scored = json.loads((run / "eval/test/metrics.json").read_text())
    assert scored["images"] == VAL_IMAGES and "test/acc" in out
    assert scored["metrics"]["test/acc"] == pytest.approx(evaluated["keras"][1]["metrics"]["val/acc"], abs=1e-9)


@pytest.mark.keras
@pytest.mark.parametrize("backend", BACKENDS)
def test_detection_eval_and_predict_give_the_map_training_measured(detection_runs, data_dir, tmp_path, capsys, backend):
    root, runs = detection_runs
    best = runs[backend]["best"]["val/map"]
    code, _, err = _use(capsys, "eval", str(root / backend))
    assert code == 0, err[-3000:]
    scored = json.loads((root / backend / "eval/val/metrics.json").read_text())
    assert scored["metrics"]["val/map"] == pytest.approx(best, abs=1e-4) and scored["images"] == 200
    ap = [row["ap"] for row in scored["per_class"].values() if row["ap"] is not None]
    assert len(ap) == 10 and np.mean(ap) == pytest.approx(scored["metrics"]["val/map"], abs=1e-6)  # COCO's mean
    val = data_dir / "digits_detection"
    annotations = val / "annotations/instances_val2017.json"
    code, _, err = _use(
        capsys,
        "predict",
        str(root / backend),
        f"source={val / 'val2017'}",
        f"annotations={annotations}",
        f"out={tmp_path}",
    )
    assert code == 0, err[-3000:]
    from faster_coco_eval import COCO, COCOeval_faster

    truth = COCO(str(annotations))
    evaluation = COCOeval_faster(truth, truth.loadRes(str(tmp_path / "predictions.json")), iouType="bbox")
    evaluation.run()
    assert evaluation.stats_as_dict["AP_all"] == pytest.approx(best, abs=1e-4)  # COCO results of the val images


def _detections_with_nms_outside(boxes, scores, post: dict):
    """One image's detections from an exported detector's boxes [N, 4] and class probabilities [N, 1 + K], with the
    NMS preprocessing.json describes, done by torchvision: (boxes, scores, labels 1..K)."""
    import torch
    from torchvision.ops import batched_nms

    classes = scores.shape[1] - 1
    flat = torch.from_numpy(scores[:, 1:]).reshape(-1)
    top, where = flat.topk(min(post["pre_nms_top_k"], flat.numel()))
    chosen = top > post["score_threshold"]
    top, where = top[chosen], where[chosen]
    anchors, labels = where // classes, where % classes + 1
    candidates = torch.from_numpy(boxes)[anchors]
    keep = batched_nms(candidates, top, labels, post["iou_threshold"])[: post["max_detections"]]
    return candidates[keep].numpy(), top[keep].numpy(), labels[keep].numpy()


@pytest.mark.keras
@pytest.mark.parametrize("backend,fmt", [("lightning", "onnx"), ("keras", "saved_model")])
def test_an_exported_detector_with_nms_outside_scores_the_runs_map(detection_runs, data_dir, capsys, backend, fmt):
    from faster_coco_eval import COCO, COCOeval_faster

    root, runs = detection_runs
    code, out, err = _use(capsys, "export", str(root / backend), f"format={fmt}")
    assert code == 0, err[-3000:]
    folder = root / backend / "export" / fmt
    assert json.loads((folder / "check.json").read_text())["result"] == "passed"
    post = json.loads((folder / "preprocessing.json").read_text())["postprocessing"]
    exported = _exported_model(fmt, folder / MODEL_FILES[fmt], ("boxes", "scores"))
    truth = json.loads((data_dir / "digits_detection/annotations/instances_val2017.json").read_text())
    sizes = {image["id"]: (image["width"], image["height"]) for image in truth["images"]}
    categories = sorted(c["id"] for c in truth["categories"])
    found = []
    for images, _, image_ids in _deserialized_batches(folder / "dali_pipeline.bin", 200):
        outputs = exported(images)
        for image_id, boxes, scores in zip(image_ids.reshape(-1), outputs["boxes"], outputs["scores"]):
            width, height = sizes[int(image_id)]
            for (left, top, right, bottom), score, label in zip(*_detections_with_nms_outside(boxes, scores, post)):
                box = [left * width, top * height, (right - left) * width, (bottom - top) * height]
                found.append(
                    {
                        "image_id": int(image_id),
                        "category_id": categories[label - 1],
                        "bbox": box,
                        "score": float(score),
                    }
                )
    coco = COCO(truth)
    evaluation = COCOeval_faster(coco, coco.loadRes(found), iouType="bbox")
    evaluation.run()
    assert evaluation.stats_as_dict["AP_all"] == pytest.approx(runs[backend]["best"]["val/map"], abs=1e-3)


def _files_and_times(folder: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.keras
def test_bad_input_is_one_line_exit_2_and_changes_nothing(trained_on_both, evaluated, tmp_path, capsys):
    run = _run_dir(trained_on_both, "lightning")
    no_checkpoint = tmp_path / "interrupted"
    no_checkpoint.mkdir()
    shutil.copy(run / "run.json", no_checkpoint / "run.json")  # a run that never finished an epoch
    empty = tmp_path / "no images"
    empty.mkdir()
    (empty / "notes.txt").write_text("not an image")
    client = MlflowClient(f"sqlite:///{trained_on_both[0]}/mlflow.db")
    run_id = _summary(trained_on_both, "lightning")["mlflow_run_id"]
    metrics_before = client.get_run(run_id).data.metrics
    before = _files_and_times(trained_on_both[0]), _files_and_times(tmp_path)
    cases = [
        (("eval", str(tmp_path)), "holds no hydrali run"),
        (("eval", str(no_checkpoint)), "holds no checkpoint"),
        (("eval", str(run), "spilt=test"), "spilt is not a hydrali setting"),
        (("eval", str(run), "split=test"), "test is missing"),
        (("eval", str(run), f"ckpt={_summary(trained_on_both, 'keras')['best_checkpoint']}"), "not a checkpoint of"),
        (("predict", str(run), f"source={empty}"), "holds no images"),
        (("export", str(run), "format=saved_model"), "backend=lightning exports onnx or torchscript"),
        (("export", str(_run_dir(trained_on_both, "keras")), "format=torchscript"), "backend=keras exports"),
        # the run's preprocessing and network: another would feed its network images it never trained on
        (("eval", str(run), "data.image_size=64"), "data.image_size= cannot be set"),
        (("eval", str(run), "pipeline=light"), "pipeline= cannot be set"),  # it trained with pipeline=standard
        (("predict", str(run), f"source={empty}", "model.widths=[4,8,16]"), "model.widths= cannot be set"),
        (("export", str(run), "pipeline.options.mean=[0,0,0]"), "pipeline.options.mean= cannot be set"),
    ]
    for args, needle in cases:
        _refused(_use(capsys, *args), needle)
    assert (_files_and_times(trained_on_both[0]), _files_and_times(tmp_path)) == before
    assert client.get_run(run_id).data.metrics == metrics_before
    # the command line itself: the same one line and exit code
    fails_with(_hydrali(trained_on_both, "eval", str(no_checkpoint)), "holds no checkpoint")
