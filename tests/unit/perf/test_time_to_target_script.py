"""experiments/audio_captioning_synth/time_to_target.py with mmtf.train replaced by a stand-in
that writes what a run writes (metrics.json, its log): the command per seed, the table, the
results.jsonl lines and the last-line JSON."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

SCRIPT = (Path(__file__).resolve().parents[3] / "experiments" / "audio_captioning_synth"
          / "time_to_target.py")
PERF = ("[2026-12-03 21:18:10][mmtf.perf.monitor][INFO] - [perf] cpu capability AVX2, avx2=yes "
        "avx512f=no; threads 2; precision 32-true")


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("time_to_target", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_line_per_seed_and_a_summary_last(script, tmp_path, monkeypatch, capsys):
    commands = []
    reached = {12345: {"value": 0.953, "epoch": 13, "step": 1316, "train_samples": 42000,
                       "train_flops": 9_000_000_000_000},
               1: None}

    real_run = subprocess.run

    def fake_run(command, **kwargs):
        if "mmtf.train" not in command:                   # git, for results.jsonl's commit
            return real_run(command, **kwargs)
        commands.append(command)
        seed = int(next(a for a in command if a.startswith("seed="))[5:])
        if seed == 2:
            kwargs["stdout"].write("Error: a broken run\n")
            return subprocess.CompletedProcess(command, 2)
        run_dir = Path(next(a for a in command if a.startswith("hydra.run.dir="))[14:])
        run_dir.mkdir(parents=True)
        kwargs["stdout"].write(PERF + "\n")
        (run_dir / "metrics.json").write_text(json.dumps({
            "test/event_accuracy": 0.96 if seed == 12345 else 0.94, "test/cider_d": 1.4,
            "val/event_accuracy": 0.95, "train_flops": 15_000_000_000_000,
            "train_samples": 66000,
            "target": {"metric": "val/event_accuracy", "value": 0.95, "mode": "max"},
            "target_reached": reached[seed]}))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(script.subprocess, "run", fake_run)
    status = script.main(["--seeds", "12345", "1", "2", "--out", str(tmp_path / "runs"),
                          "--record", str(tmp_path), "--baseline-flops", "1.5e13", "--",
                          "trainer.max_epochs=16"])
    assert status == 1                                    # seed 2 failed
    assert [c[3:] for c in commands] == [
        ["experiment=audio_captioning", f"seed={s}", f"hydra.run.dir={tmp_path}/runs/seed_{s}",
         "trainer.max_epochs=16"] for s in (12345, 1, 2)]
    out = capsys.readouterr().out.splitlines()
    last = json.loads(out[-1])
    assert last["all_reached"] is False and last["failed"] == 1
    assert last["max_flops_to_target"] == 9_000_000_000_000
    assert last["min_test_event_accuracy"] == 0.94 and last["all_test_accuracy_met"] is False
    assert last["max_flops_vs_baseline"] == 1.0
    first = last["runs"][0]
    assert (first["samples_to_target"], first["epoch_to_target"], first["step_to_target"]) == (
        42000, 13, 1316)
    assert first["perf"].startswith("cpu capability AVX2, avx2=yes avx512f=no")
    assert "| 12345 | 13, 1316 | 42000 | 9.000 | 15.000 | 0.960 | 1.4000 |" in "\n".join(out)
    assert "| 1 | not reached |" in "\n".join(out)
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [x["seed"] for x in lines] == [12345, 1, 2]
    assert lines[2]["error"] == "exit status 2" and lines[0]["cpu"]
