"""Reading run dirs: CSV segments of resumed runs, TensorBoard times, wrong paths."""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest

from mmtf.errors import UserError
from mmtf.report import load_run, write_report

from .fixtures import make_run, write_csv


def _train_rows(steps: Iterable[int], offset: float) -> list[dict]:
    return [{"step": s, "epoch": s // 10, "train/loss": offset + s} for s in steps]


def test_resumed_run_versions_are_joined_in_step_order_without_duplicates(tmp_path):
    # version_0 ran to step 45; the run resumed from a checkpoint at step 30 into version_1
    # (logging every 10 steps): step 45 of the interrupted run was thrown away.
    run = make_run(tmp_path / "run")
    old = [*_train_rows([10, 20, 30, 40, 45], offset=1000.0),
           {"step": 19, "epoch": 1, "val/loss": 2.0}]
    old.sort(key=lambda r: r["step"])
    write_csv(run / "csv" / "version_0" / "metrics.csv", old)
    write_csv(run / "csv" / "version_1" / "metrics.csv", _train_rows(range(30, 61, 10), 2000.0))
    logs = load_run(run)
    assert logs.scalars["train/loss"] == [(10, 1010.0), (20, 1020.0), (30, 2030.0),
                                          (40, 2040.0), (50, 2050.0), (60, 2060.0)]
    assert logs.scalars["val/loss"] == [(19, 2.0)]     # the old validation stays
    assert logs.resumed_at == [30]


def test_resume_appended_to_one_csv_is_split_where_the_step_goes_back(tmp_path):
    rows = [*_train_rows([10, 20, 30, 40, 45], 1000.0), *_train_rows(range(30, 61, 10), 2000.0)]
    logs = load_run(make_run(tmp_path / "run", rows=rows))
    assert [s for s, _ in logs.scalars["train/loss"]] == [10, 20, 30, 40, 50, 60]
    assert dict(logs.scalars["train/loss"])[40] == 2040.0


def test_version_10_is_read_after_version_2(tmp_path):
    run = make_run(tmp_path / "run")
    write_csv(run / "csv" / "version_2" / "metrics.csv", _train_rows(range(0, 21, 10), 1000.0))
    write_csv(run / "csv" / "version_10" / "metrics.csv", _train_rows(range(10, 31, 10), 2000.0))
    assert load_run(run).scalars["train/loss"] == [(0, 1000.0), (10, 2010.0), (20, 2020.0),
                                                   (30, 2030.0)]


def test_tensorboard_fills_steps_the_csv_lost_and_times_each_start(tmp_path):
    """CSVLogger deletes metrics.csv on a resume into the same dir; the event files stay."""
    from torch.utils.tensorboard import SummaryWriter

    run = make_run(tmp_path / "run", rows=_train_rows(range(30, 61, 10), 2000.0))
    tb_dir = run / "tensorboard"
    # Start 1: steps 0..30 over 15 s; start 2 (an hour later): steps 30..60 over 10 s.
    for steps, t0 in ((range(0, 31, 10), 1_000.0), (range(30, 61, 10), 4_600.0)):
        writer = SummaryWriter(str(tb_dir))
        dt = 15.0 if t0 == 1_000.0 else 10.0
        for i, s in enumerate(steps):
            writer.add_scalar("train/loss", float(s), s, walltime=t0 + dt * i / (len(steps) - 1))
        writer.close()
    logs = load_run(run)
    assert logs.scalars["train/loss"] == [(0, 0.0), (10, 10.0), (20, 20.0), (30, 2030.0),
                                          (40, 2040.0), (50, 2050.0), (60, 2060.0)]
    # 60 steps in 25 s of logging; the hour between the starts is not training.
    assert logs.timing.steps_per_s == pytest.approx(60 / 25)
    assert "TensorBoard" in logs.timing.throughput_source


def test_wall_time_from_the_job_log(tmp_path):
    lines = ["[2026-11-30 10:00:00,250][mmtf.train][INFO] - start",
             "  a continuation line without a time",
             "[2026-11-30 10:03:20,750][mmtf.train][INFO] - end"]
    logs = load_run(make_run(tmp_path / "run", rows=_train_rows(range(0, 101, 10), 0.0),
                             log_lines=lines))
    assert logs.timing.wall_s == pytest.approx(200.5)
    assert logs.timing.source == "first to last line of audio_captioning.log"
    # No TensorBoard events: steps 0..100 (101 steps) over the wall time, and it says so.
    assert logs.timing.steps_per_s == pytest.approx(101 / 200.5)
    assert "no times per step" in logs.timing.throughput_source


def test_missing_dir_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(UserError, match=r"run_dir .*nowhere does not exist; pass run_dir=outputs/"):
        load_run(tmp_path / "nowhere")


def test_dir_that_is_not_a_run(tmp_path):
    (tmp_path / "stuff").mkdir()
    with pytest.raises(UserError, match=r"stuff is neither a run dir \(no .hydra/config.yaml\) "
                                        r"nor a multirun dir \(no multirun.yaml\); pass run_dir="):
        load_run(tmp_path / "stuff")


def test_a_dir_of_runs_is_not_a_multirun(tmp_path):
    """Run dirs side by side (outputs/<task>/runs/) are not a sweep: no multirun.yaml."""
    make_run(tmp_path / "runs" / "a", rows=None)
    make_run(tmp_path / "runs" / "b", rows=None)
    with pytest.raises(UserError, match=r"runs is neither a run dir"):
        write_report(tmp_path / "runs")


def test_run_without_logs_says_which_logger_to_use(tmp_path):
    run = make_run(tmp_path / "run", rows=None)
    with pytest.raises(UserError, match=r"holds no training logs .* logger=default"):
        load_run(run)


def test_wall_time_falls_back_to_file_times_without_a_job_log(tmp_path):
    run = make_run(tmp_path / "run", rows=_train_rows(range(0, 11, 10), 0.0))
    (run / "report").mkdir()
    (run / "report" / "summary.md").write_text("an earlier report, written much later\n")
    files = [p for p in run.rglob("*") if p.is_file() and p.parent.name != "report"]
    for i, path in enumerate(files):         # the oldest at t=1000 s, the newest 90 s later
        t = 1000.0 + (90.0 if i == len(files) - 1 else 0.0)
        os.utime(path, (t, t))
    timing = load_run(run).timing
    assert timing.wall_s == pytest.approx(90.0)
    assert timing.source == "oldest to newest file modification time in the run dir"
