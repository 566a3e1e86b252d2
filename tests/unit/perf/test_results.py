"""``append_result``: one JSON line per run, with what makes the figures comparable later;
``run_perf_line``: the CPU line of a run's log that goes with it."""

from __future__ import annotations

import json
import subprocess
import sys

from mmtf.perf.device import describe_cpu
from mmtf.perf.results import RESULTS_FILE, append_result, run_perf_line


def test_each_call_appends_one_line_and_returns_the_result_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["run.py", "--quick"])
    script = tmp_path / "run.py"
    script.write_text("")
    first = {"speedup": 1.5, "rows": {"a": 1}}
    assert append_result(script, first) is first               # a file: its folder gets the line
    append_result(tmp_path, {"speedup": 2.0})
    lines = (tmp_path / RESULTS_FILE).read_text().splitlines()
    assert len(lines) == 2
    one, two = map(json.loads, lines)
    assert (one["speedup"], one["rows"], two["speedup"]) == (1.5, {"a": 1}, 2.0)
    assert one["cpu"] == describe_cpu()
    assert one["command"].endswith("run.py --quick")
    assert one["date"].endswith("+00:00")                       # UTC, ISO 8601
    assert {"commit", "dirty"} <= one.keys()


def test_inside_a_repository_the_commit_is_head_and_dirty_says_if_tracked_files_changed(tmp_path):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                               "user.email=t@t", *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "run.py").write_text("print(1)\n")
    git("add", "run.py")
    git("commit", "-qm", "a script")
    append_result(tmp_path, {"x": 1})
    (tmp_path / "run.py").write_text("print(2)\n")
    append_result(tmp_path, {"x": 2})
    clean, dirty = map(json.loads, (tmp_path / RESULTS_FILE).read_text().splitlines())
    assert clean["commit"] == dirty["commit"] == git("rev-parse", "HEAD")
    assert (clean["dirty"], dirty["dirty"]) == (False, True)


def test_run_perf_line_is_the_first_cpu_line_without_the_logging_prefix():
    log = ("Seed set to 1\n"
           "[2026-12-05 07:14:19,216][mmtf.perf.monitor][INFO] - [perf] train epoch 0: 3000 "
           "samples in 11.6 s\n"
           "[2026-12-05 07:14:07,328][mmtf.perf.monitor][INFO] - [perf] cpu capability AVX2, "
           "avx2=yes avx512f=no; threads 2 \n"
           "[x][mmtf.perf.monitor][INFO] - [perf] cpu capability AVX512, later\n")
    assert run_perf_line(log) == "cpu capability AVX2, avx2=yes avx512f=no; threads 2"
    assert run_perf_line("Seed set to 1\nno perf here\n") is None
