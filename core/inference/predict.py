"""`hydrali predict RUN_DIR source=FOLDER [top_k=5] [out=DIR] [key=value ...]`: every image under FOLDER
(recursively, by the extensions DALI's file reader reads) through the run's validation recipe in DALI, in batches,
and its trained network; the task writes what it predicts (classification: predictions.csv with the top-k classes
and their probabilities). Files that cannot be decoded are checked first, listed (skipped_files.txt) and left out."""

from __future__ import annotations

from pathlib import Path

from hydrali.core.data.image_files import IMAGE_EXTENSIONS, SKIPPED_FILES, Verify, find_bad_files, images
from hydrali.core.errors import HydraliError
from hydrali.core.inference.loaded import load
from hydrali.core.inference.trained_run import open_run


def images_under(folder: Path) -> list[Path]:
    """Every file under `folder` (recursively) whose extension DALI's file reader reads, in sorted order."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def predict(path: str | None, overrides: list[str]) -> Path:
    """Label the images of `source` with the run in `path`; return the folder the predictions went to."""
    run = open_run("predict", path, overrides)
    if run.options.source is None:
        raise HydraliError(f"hydrali predict {path} source=FOLDER: name the folder of images to label")
    folder = Path(str(run.options.source)).expanduser().resolve()
    if not folder.is_dir():
        raise HydraliError(f"source={run.options.source} is not a folder: pass a folder of images")
    found = images_under(folder)
    if not found:
        raise HydraliError(
            f"source={run.options.source} holds no images (files ending {', '.join(IMAGE_EXTENSIONS[:4])}, ...): "
            f"pass a folder of images"
        )
    bad: list[tuple[Path, str]] = []
    files: list[str] = []

    def data(task):  # after the checkpoint is found: every image is decoded once here
        bad.extend(find_bad_files(found, Verify.full, limit=None))
        gone = {p for p, _ in bad}
        files.extend(str(p.relative_to(folder)) for p in found if p not in gone)
        if not files:
            raise HydraliError(f"source={run.options.source}: none of its {images(len(found))} can be decoded")
        trained_on = task.prepare_data(run.cfg.data, Verify.off)  # the run's classes
        annotations = run.options.annotations
        return task.prediction_data(trained_on, folder, files, None if annotations is None else str(annotations))

    loaded = load(run, data, "prediction_data")
    predictions = loaded.task.predictions(loaded.dataset, int(run.options.top_k))
    position = 0
    for batch in loaded.batches("predict"):
        size = len(next(iter(batch.values())))
        predictions.update(files[position : position + size], loaded.network.predict(batch), batch)
        position += size
    out = Path(str(run.options.out)).expanduser()
    out = (out if out.is_absolute() else run.run_dir / out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    written = predictions.write(out)
    replaced = [p for p in written if p in before]  # an earlier prediction's, named below
    skipped = out / SKIPPED_FILES
    skipped.unlink(missing_ok=True)  # an earlier prediction's
    if bad:
        skipped.write_text("".join(f"{p}\t{why}\n" for p, why in bad))
        written.append(skipped)
    print(f"hydrali predict: {loaded.describe()}", flush=True)
    print(f"{images(loaded.dataset.num_val)} of {folder} predicted", flush=True)
    for p, why in bad:
        print(f"skipped (cannot be decoded): {p}: {why}", flush=True)
    if replaced:
        print(
            f"replaced (an earlier prediction's; pass out=DIR to keep both): {', '.join(str(p) for p in replaced)}",
            flush=True,
        )
    print(f"written: {', '.join(str(p) for p in written)}", flush=True)
    return out
