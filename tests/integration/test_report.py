"""`python -m mmtf.report` as a user runs it, on hand-written run and multirun dirs."""

from __future__ import annotations

import pytest

from tests.unit.report.fixtures import csv_rows, make_run

from .conftest import run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow    # a fresh interpreter: the report CLI's console path
def test_report_of_a_run_writes_png_and_summary(tmp_path):
    run = make_run(tmp_path / "run", rows=csv_rows(), metrics={"test/event_accuracy": 0.65},
                   config={"task_name": "audio_captioning", "optimized_metric": "val/loss",
                           "optimized_mode": "min"}, overrides=[])
    out = run_cli("mmtf.report", [f"run_dir={run}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (run / "report" / "learning_curves.png").read_bytes().startswith(PNG_MAGIC)
    summary = (run / "report" / "summary.md").read_text()
    assert "- best `val/loss` (min): **2.5000** (epoch 1, step 19)" in summary
    assert summary in out.stdout
    assert not (tmp_path / "outputs").exists()       # a report writes only into out_dir
