"""hydrali-bench end to end at a tiny size on this machine: its table and its JSON (their fields, not speeds).

On a machine without a GPU the CPU-only part runs (loaders through the data layers, raw DALI, the PIL
DataLoader; the detection recipe on the CPU) and every GPU part is one "skipped: needs a GPU" row.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SECTIONS = ["loaders", "cpu", "lightning", "keras", "detection"]
COLUMNS = "| section | measurement | device | images/s (median) | at the median step | ratio vs baselines |"


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One tiny run of every section: (completed process, parsed JSON)."""
    root = tmp_path_factory.mktemp("bench")
    command = [
        sys.executable,
        "-m",
        "hydrali.bench.cli",
        f"hydra.run.dir={root}/run",
        f"paths.data_dir={root}/data",
        "bench.sections=[" + ",".join(SECTIONS) + "]",
        "bench.repeats=3",
        "bench.warmup=1",
        "bench.batches=2",
        "bench.synthetic.classes=2",
        "bench.synthetic.train_per_class=8",
        "bench.synthetic.val_per_class=2",
        "data.batch_size=4",
        "data.image_size=64",
        "bench.detection.overrides=["
        + ",".join(
            f"'{o}'"
            for o in (
                "data.batch_size=4",
                "data.generate.num_train=8",
                "data.generate.num_val=4",
                f"data.root={root}/data/det",
            )
        )
        + "]",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads((root / "run" / "bench.json").read_text())


def test_table_is_printed_last_with_every_section(bench_run):
    done, _ = bench_run
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    header = lines.index(COLUMNS)
    rows = lines[header + 2 :]
    assert rows and all(line.startswith("| ") and line.endswith(" |") for line in rows)  # nothing after the table
    titles = {line.split(" | ")[0][2:] for line in rows}
    assert titles == {"1 loaders", "4 cpu-only", "2 lightning", "3 keras", "5 detection"}
    for cells in (line.split(" | ") for line in rows):
        assert len(cells) == 6
        assert cells[3].startswith("skipped: ") or float(cells[3].replace(",", "")) > 0
        assert cells[4] == "-"  # the loaders are not timed step by step; the training rows need a GPU here


def test_gpu_parts_are_skipped_with_their_reason_on_a_machine_without_one(bench_run):
    done, results = bench_run
    if results["gpu"] is not None:
        pytest.skip("this machine has a GPU")
    skipped = {row["section"]: row["skipped"] for row in results["rows"] if row["skipped"]}
    assert set(skipped) == {"lightning", "keras", "detection"}
    assert all(reason.startswith("needs a GPU") for reason in skipped.values())
    for section in ("2 lightning", "3 keras", "5 detection"):
        assert any(
            line.startswith(f"| {section} |") and "skipped: needs a GPU" in line for line in done.stdout.splitlines()
        )


def test_json_holds_every_repeat_its_median_and_the_ratios(bench_run):
    _, results = bench_run
    assert results["command"].startswith("hydrali-bench ")
    assert {"date", "host", "gpu", "cpu_cores", "versions", "commit", "bench"} <= set(results)
    assert {"python", "torch", "lightning"} <= set(results["versions"])
    rows = {row["key"]: row for row in results["rows"]}
    measured = [row for row in rows.values() if not row["skipped"]]
    assert measured
    for row in measured:
        assert len(row["repeats"]) == 3 and all(v > 0 for v in row["repeats"])
        assert row["images_per_s"] == pytest.approx(statistics.median(row["repeats"]))
        assert row["median_step_images_per_s"] is None and row["step_repeats"] == []
        for key in row["baselines"]:
            base = rows[key]
            assert row["ratios"][base["short"]] == pytest.approx(row["images_per_s"] / base["images_per_s"])
    by_section = {s: [r for r in measured if s in r["sections"]] for s in ("loaders", "cpu", "detection")}
    labels = [r["measurement"] for r in by_section["loaders"]]
    for recipe in ("standard", "light"):  # each recipe: both data layers, raw DALI, the PIL DataLoader
        assert f"hydrali data layer, Lightning ({recipe})" in labels
        assert any(label.startswith(f"PIL DataLoader ({recipe})") for label in labels)
        assert any(label.startswith(f"raw DALI {recipe} (CHW)") for label in labels)
        if results["versions"].get("tensorflow"):
            assert f"hydrali data layer, Keras ({recipe})" in labels
    cpu = by_section["cpu"]
    assert {r["device"] for r in cpu} == {"cpu"} and len(cpu) == 4
    assert any(r["measurement"].startswith("raw DALI ssd, CPU operators") for r in by_section["detection"])


def test_bench_help_explains_the_benchmark_not_training(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "hydrali.bench.cli", "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("hydrali-bench: how close hydrali trains to the GPU's limit")
    assert "bench.sections=[loaders,cpu]" in done.stdout and "sections:" in done.stdout  # the config's bench node
    assert "hydrali eval RUN_DIR" not in done.stdout  # before: hydrali's own usage


def test_a_training_window_without_a_warm_up_step_is_one_error_naming_the_setting(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hydrali.bench.cli",
            f"hydra.run.dir={tmp_path}/run",
            "bench.train.warmup=0",
            "bench.sections=[cpu]",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()  # one line, naming the setting and what it takes
    assert line.startswith("hydrali-bench: error: bench.train.warmup=0") and "at least 1" in line


def test_the_import_profile_names_the_packages_a_command_imported_and_passes_on_its_exit_code(tmp_path):
    """bench/gpu/import_profile.py: the table of a real `-X importtime` run (what a GPU session reads to see where a
    run's start-up goes) has a row for each package the command imported at the top level, and its exit is the
    command's."""
    command = [sys.executable, "-m", "hydrali.bench.gpu.import_profile", "--log", str(tmp_path / "imports.log"), "--"]
    done = subprocess.run(
        [*command, sys.executable, "-c", "import email.mime.text, json; raise SystemExit(3)"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert {"email", "json"} <= rows.keys(), done.stdout
    assert float(rows["email"].split("|")[2]) > 0
    assert "exit 3" in done.stdout.splitlines()[-1]


def test_the_import_profile_sums_only_top_level_records_by_package():
    """Python's -X importtime records (a header, nested imports indented two spaces a level after the bar): only the
    top-level ones count, each under its package's name, so that nothing is counted twice."""
    from hydrali.bench.gpu.import_profile import top_level_imports

    records = [
        "import time: self [us] | cumulative | imported package\n",
        "import time:       100 |        100 |     numpy.core._multiarray\n",  # depth 2: inside numpy
        "import time:       200 |        300 |   numpy.core\n",  # depth 1: inside numpy
        "import time:       400 |        700 | numpy\n",
        "import time:        50 |         50 |   json.decoder\n",
        "import time:        30 |         80 | json\n",
        "import time:        20 |         20 | numpy.random\n",  # a later top-level import of the same package
        "[hydrali][INFO] - not a record\n",
    ]
    assert top_level_imports(records) == pytest.approx({"numpy": 720e-6, "json": 80e-6})
