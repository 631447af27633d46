"""hydrali-bench's sweep section (8): the same sweep as whole `hydrali -m` commands with Hydra's basic launcher (one
job after another) and with hydrali's (jobs at once), its own table and JSON. This machine has no GPU: the parallel
sweep is given GPU ids (hydra.launcher.gpus=[0,1], in bench.sweep.overrides, which the baseline does not take) and
its jobs train on the CPU; without such ids the section is one skipped row."""

from __future__ import annotations

import json
import re

import pytest

from hydrali.bench.report import OWN_COLUMNS, Report, Row
from hydrali.bench.sweep import BOUND_FACTOR, BOUND_SLACK_S, job_count, launcher_only
from hydrali.core.errors import HydraliError
from tests.support.cli import run_cli
from tests.support.configs import LIGHTNING_QUIET, TINY

BENCH = ("-m", "hydrali.bench.cli")  # the hydrali-bench command
TWO_GPUS = "hydra.launcher.gpus=[0,1]"
HEADER = "| " + " | ".join(OWN_COLUMNS["sweep"]) + " |"


def _sweep_rows(stdout: str) -> list[list[str]]:
    """The cells of the sweep table's rows printed in `stdout`."""
    return [
        [c.strip() for c in line.strip("|").split(" | ")] for line in stdout.splitlines() if line.startswith("| 8 ")
    ]


def test_launcher_overrides_go_to_the_parallel_sweep_only():
    both, parallel = launcher_only(["epochs=1", TWO_GPUS, "hydra/launcher=joblib", "hydra.sweep.subdir=x"])
    assert both == ["epochs=1", "hydra.sweep.subdir=x"] and parallel == [TWO_GPUS, "hydra/launcher=joblib"]


def test_the_grid_makes_one_job_per_combination_of_its_values():
    assert job_count("optim.lr=0.05,0.1,0.2,0.4") == 4 and job_count("optim.lr=0.1,0.2 seed=1,2,3 epochs=2") == 6
    with pytest.raises(HydraliError, match=r"^bench\.sweep\.grid=epochs=2: give a swept override"):
        job_count("epochs=2")


def test_a_sweep_reads_bench_sweep_root_or_section_7s_folder_where_its_data_needs_a_root(bench_with, tmp_path):
    small = ["bench.small.synthetic.classes=2", "bench.small.synthetic.train_per_class=2"]
    bench = bench_with(*small, "bench.small.synthetic.val_per_class=1")
    paths = f"paths.data_dir={tmp_path}/data"  # the command line's, which the section passes on
    folder = tmp_path / "data" / "synthetic-small-2x2x1"
    assert bench.bench.sweep.overrides == ["experiment=cifar10", "tracking=none"]  # conf/bench.yaml's default
    assert bench.sweep_data(["experiment=cifar10", paths]) == [f"data.root={folder}"]
    assert sorted(p.name for p in (folder / "train").iterdir()) == ["class0", "class1"]
    assert bench.sweep_data(["epochs=1", paths]) == []  # the bundled digits: as they are
    chosen = bench_with("bench.sweep.root=/data/cifar").sweep_data(["experiment=cifar10", paths])
    assert chosen == ["data.root=/data/cifar"]
    with pytest.raises(HydraliError, match=r"^bench\.sweep\.overrides: .*epochz"):
        bench.sweep_data(["epochz=1", paths])


def test_the_sweep_section_has_its_own_table_after_the_main_one():
    report = Report()
    report.add(Row("small", "small/bound", "bound", "gpu", repeats=[10.0]))
    report.add(Row("sweep", "sweep/sequential", "one after another", "cpu", cells=["12.0", "2"]))
    report.skip("sweep", "at once", "why")

    main, own = report.table(["small", "sweep"]).split("\n\n")

    assert "| 7 small images | bound | gpu | 10 |" in main and "8 sweep" not in main
    header, _, sequential, skipped = own.splitlines()
    assert header == HEADER
    assert sequential.startswith("| 8 sweep | one after another | cpu | 12.0 | 2 | - |")
    assert skipped.startswith("| 8 sweep | at once | - | skipped: why | - |")
    assert report.table(["sweep"]) == own  # no main table without one of its sections


@pytest.mark.slow
def test_the_sweep_section_runs_both_launchers_on_the_cpu_and_compares_their_jobs(tmp_path, data_dir):
    settings = [*TINY, "epochs=1", "tracking=none", *LIGHTNING_QUIET, TWO_GPUS]
    done = run_cli(
        f"hydra.run.dir={tmp_path}/run",
        f"paths.data_dir={data_dir}",  # the bundled digits: both sweeps' data, written once a session
        "bench.sections=[sweep]",
        "bench.sweep.overrides=[" + ",".join(f"'{o}'" for o in settings) + "]",
        "bench.sweep.grid='optim.lr=0.05,0.1'",
        cwd=tmp_path,
        entry=BENCH,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(done.stdout[done.stdout.index(HEADER) :])  # the table, for the record
    sequential, parallel = _sweep_rows(done.stdout)
    columns = OWN_COLUMNS["sweep"]
    assert sequential[1].startswith("2 jobs (optim.lr=0.05,0.1), hydra/launcher=basic")
    assert parallel[1].startswith("2 jobs (optim.lr=0.05,0.1), hydrali's launcher: at once, 1 GPU(s) each")
    for row in (sequential, parallel):
        cell = dict(zip(columns, row))
        assert cell["jobs"] == "2" and cell["GPUs"] == "2" and cell["device"] == "cpu"
    assert dict(zip(columns, sequential))["speedup"] == "(baseline)"
    assert re.fullmatch(r"\d+\.\d\dx", dict(zip(columns, parallel))["speedup"])
    assert "(within 0.01)" in dict(zip(columns, parallel))["largest best difference"]
    # each job's per-job line, as the section ran it
    for launcher in ("sequential", "parallel"):
        for job in (0, 1):
            assert f"bench: sweep, {launcher} launcher, repeat 1: job {job} on 1 GPU(s)" in done.stdout

    rows = {row["key"]: row for row in json.loads((tmp_path / "run" / "bench.json").read_text())["rows"]}
    base, at_once = rows["sweep/sequential"]["notes"], rows["sweep/parallel"]["notes"]
    assert rows["sweep/parallel"]["baselines"] == ["sweep/sequential"]
    for notes, launcher in ((base, "sequential"), (at_once, "parallel")):
        [run] = notes["runs"]
        assert notes["jobs"] == 2 and notes["machine_gpus"] == 2 and [j["number"] for j in run["per_job"]] == [0, 1]
        sweep = tmp_path / "run" / "sweep" / launcher / "r1"
        for job in run["per_job"]:  # the figures are the jobs' own summaries'
            summary = json.loads((sweep / str(job["number"]) / "summary.json").read_text())
            assert job["train_seconds"] == summary["train_seconds"] and job["best"] == summary["best"]["val/acc"]
            assert job["wall_parts"] == summary["wall_parts"]  # where each job's time went, logged on its line
            name = f"{launcher} launcher, repeat 1: job {job['number']} on 1 GPU(s)"
            line = next(line for line in done.stdout.splitlines() if name in line)
            assert f"wall {summary['wall_seconds']:.1f} s: startup {summary['wall_parts']['startup_s']:.1f}" in line
            assert job["gpus"] == 1
        gpu_seconds = sum(j["train_seconds"] for j in run["per_job"])
        assert notes["gpu_seconds"] == pytest.approx(gpu_seconds)
        assert notes["bound_seconds"] == pytest.approx(BOUND_FACTOR * gpu_seconds / 2 + BOUND_SLACK_S)
        assert notes["efficiency"] == pytest.approx(gpu_seconds / (2 * notes["wall_seconds"]))
        assert notes["repeats_within_bound"] == int(notes["wall_seconds"] <= notes["bound_seconds"])
    assert at_once["speedup"] == pytest.approx(base["wall_seconds"] / at_once["wall_seconds"])
    for job in (0, 1):  # the same job on either launcher: the same seed, the same best
        assert at_once["best_per_job"][str(job)] == pytest.approx(base["best_per_job"][str(job)], abs=0.01)
    assert at_once["largest_best_difference"] <= 0.01 and at_once["best_within_tolerance"] is True

    parallel_dir = tmp_path / "run" / "sweep" / "parallel" / "r1"
    firsts = [log.read_text().splitlines()[0] for log in sorted(parallel_dir.glob("*.console.log"))]
    gpus = [re.match(r"hydrali: job (\d) on GPUs (\S+):", line).group(2) for line in firsts]
    assert sorted(gpus) == ["0", "1"], firsts  # the parallel jobs held one GPU id each, a different one
    assert not list((tmp_path / "run" / "sweep" / "sequential" / "r1").glob("*.console.log"))  # one after another


def test_without_a_gpu_or_gpu_ids_the_section_is_one_skipped_row(tmp_path):
    done = run_cli(f"hydra.run.dir={tmp_path}/run", "bench.sections=[sweep]", cwd=tmp_path, entry=BENCH, timeout=120)
    results = json.loads((tmp_path / "run" / "bench.json").read_text())
    if results["gpu"] is not None:
        pytest.skip("this machine has a GPU")
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = _sweep_rows(done.stdout)
    assert row[3].startswith("skipped: needs a GPU (") and "hydra.launcher.gpus=[0,1]" in row[3]
    assert not (tmp_path / "run" / "sweep").exists()


def test_a_list_of_overrides_unquoted_says_how_to_quote_its_items_and_that_form_parses(tmp_path):
    """hydrali-bench's list of hydrali overrides, given as `[experiment=cifar10,tracking=none]` (each item holds
    '='): one line naming the form Hydra parses, and that form gives the list."""
    out = run_cli("bench.sweep.overrides=[experiment=cifar10,tracking=none]", "--cfg", "job", cwd=tmp_path, entry=BENCH)
    suggested = "bench.sweep.overrides=['experiment=cifar10','tracking=none']"
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("hydrali-bench: error: ") and "quote each item of the list" in line, line
    assert f'"{suggested}"' in line, line
    parsed = run_cli(suggested, "--cfg", "job", cwd=tmp_path, entry=BENCH)
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    assert "    overrides:\n    - experiment=cifar10\n    - tracking=none\n" in parsed.stdout
