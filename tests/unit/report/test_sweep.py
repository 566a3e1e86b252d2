"""A multirun dir as one table: jobs sorted by the metric, with their overrides."""

from __future__ import annotations

import pytest

from mmtf.errors import UserError
from mmtf.report import summarize_sweep, write_report

from .fixtures import make_run

LRS = ["3e-4", "1e-3", "3e-3", "1e-2"]
ACCURACY = [0.50, 0.90, 0.70, None]          # job 3 did not finish (no metrics.json)


def _sweep(tmp_path, mode="max"):
    config = {"task_name": "audio_captioning", "optimized_metric": "val/event_accuracy",
              "optimized_mode": mode}
    for job, (lr, acc) in enumerate(zip(LRS, ACCURACY)):
        make_run(tmp_path / "sweep" / str(job), config=config, rows=None,
                 metrics=None if acc is None else {"val/event_accuracy": acc, "val/loss": 1.0},
                 overrides=["experiment=audio_captioning", f"model.optimizer.lr={lr}",
                            "trainer.max_epochs=1"])
    return tmp_path / "sweep"


@pytest.mark.parametrize(("mode", "order"), [("max", ["1", "2", "0", "3"]),
                                             ("min", ["0", "2", "1", "3"])])
def test_jobs_sorted_best_first_unfinished_last(tmp_path, mode, order):
    sweep = summarize_sweep(_sweep(tmp_path, mode))
    assert [job.name for job in sweep.jobs] == order
    assert sweep.mode == mode


def test_table_holds_each_jobs_overrides_and_metric(tmp_path):
    sweep = summarize_sweep(_sweep(tmp_path))
    assert sweep.swept == ["model.optimizer.lr"]
    assert sweep.common == {"experiment": "audio_captioning", "trainer.max_epochs": "1"}
    assert {job.name: job.params["model.optimizer.lr"] for job in sweep.jobs} == {
        "0": 3e-4, "1": 1e-3, "2": 3e-3, "3": 1e-2}
    rows = [line for line in sweep.to_markdown().splitlines() if line.startswith("| ")][1:]
    assert rows == ["| 1 | 1 | `1e-3` | 0.9000 |  |",
                    "| 2 | 2 | `3e-3` | 0.7000 |  |",
                    "| 3 | 0 | `3e-4` | 0.5000 |  |",
                    "| — | 3 | `1e-2` | not finished |  |"]


def test_metric_can_be_chosen(tmp_path):
    sweep = summarize_sweep(_sweep(tmp_path), metric="val/loss", mode="min")
    assert sweep.metric == "val/loss"
    assert [job.metric for job in sweep.jobs] == [1.0, 1.0, 1.0, None]


def test_a_single_run_is_not_a_sweep(tmp_path):
    run = make_run(tmp_path / "run", rows=None)
    with pytest.raises(UserError, match=r"run is a single run, not a multirun dir"):
        summarize_sweep(run)


def test_write_report_of_a_multirun_writes_table_and_plot(tmp_path):
    out_dir = tmp_path / "elsewhere"
    written = write_report(_sweep(tmp_path), out_dir)
    assert written == [out_dir / "sweep.png", out_dir / "summary.md"]
    assert (out_dir / "sweep.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    summary = (out_dir / "summary.md").read_text()
    assert "![metric against each swept parameter](sweep.png)" in summary
