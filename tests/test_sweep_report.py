"""The sweep's summary table: its best job by the objective's direction, a line per job, the swept settings only."""

from hydrali.core.tracking.sweep_report import JobRow, SweepSummary, format_sweep_table, swept_keys


def _rows() -> list[JobRow]:
    common = ["epochs=3", "backend=lightning"]
    return [
        JobRow("0", "r0", "FINISHED", [*common, "optim.lr=0.01", "seed=1"], 0.5, None),
        JobRow("1", "r1", "FINISHED", [*common, "optim.lr=0.1", "seed=1"], 0.25, None),
        JobRow(
            "2",
            "r2",
            "FAILED",
            [*common, "optim.lr=10.0", "seed=1"],
            None,
            "train/loss became nan in epoch 1: training diverged",
        ),
    ]


def test_only_the_keys_that_vary_between_jobs_are_the_sweeps_axes():
    assert swept_keys(_rows()) == ["optim.lr"]
    assert swept_keys(_rows()[:1]) == [], "one job sweeps nothing"


def test_the_table_names_the_best_job_in_the_objectives_direction_and_each_jobs_error():
    best = _rows()[1]  # the smaller val/loss
    table = format_sweep_table(SweepSummary(rows=_rows(), metric="val/loss", mode="min", best=best, status="FINISHED"))
    lines = table.splitlines()
    head = lines[1]
    assert "3 job(s), 1 failed" in head and "parent run FINISHED" in head
    assert "best val/loss 0.25 (min), job 1: optim.lr=0.1" in head
    jobs = {line.split()[0]: line for line in lines[3:-1] if line.split()[0].isdigit()}
    assert set(jobs) == {"0", "1", "2"}
    assert "FAILED" in jobs["2"] and "training diverged" in jobs["2"] and " - " in jobs["2"], "no value, the error"
    assert "optim.lr=0.01" in jobs["0"] and "epochs" not in table and "seed" not in table, "only the swept key"
    assert lines[0] == lines[2] == lines[-1] and set(lines[0]) == {"-"}


def test_a_sweep_with_no_finished_job_has_no_best():
    failed = [row for row in _rows() if row.status == "FAILED"]
    table = format_sweep_table(SweepSummary(rows=failed, metric="val/acc", mode="max", best=None, status="FAILED"))
    assert "parent run FAILED" in table and "best" not in table.splitlines()[1]
