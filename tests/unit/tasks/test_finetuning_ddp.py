"""Unfreezing at an epoch under two-rank CPU DDP (gloo): the unfrozen encoder's gradients are
all-reduced (both ranks end with the same weights though each trains on its own batches), and a
run resumed past the unfreeze epoch ends bit for bit where the uninterrupted run ended (gloo's
sum of two ranks is deterministic)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("ddp_unfreeze_script.py")
REPO = Path(__file__).resolve().parents[3]


def run(mode: str, out: Path) -> list[dict]:
    """Both ranks' saved end state of ``ddp_unfreeze_script.py MODE``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(SCRIPT), mode, str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return [torch.load(out / f"{mode}_rank{r}.pt", weights_only=True) for r in (0, 1)]


def assert_equal_states(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_ddp_unfreeze_all_reduces_and_resumes_past_the_epoch_bit_exactly(tmp_path):
    full = run("full", tmp_path)
    initial = torch.load(tmp_path / "initial_encoder.pt", weights_only=True)
    for rank in full:
        assert [s[1:] for s in rank["states"]] == [(False, False)] * 2 + [(True, True)] * 4
        assert_equal_states(rank["epochs"][0], initial)                 # frozen in epoch 0
        assert not all(torch.equal(rank["epochs"][1][k], v) for k, v in initial.items())
    assert_equal_states(full[0]["weights"], full[1]["weights"])       # all-reduced
    run("stop", tmp_path)                        # epochs 0-1, checkpoint after the unfreeze
    resumed = run("resume", tmp_path)
    for rank, ref in zip(resumed, full):
        assert rank["states"] == full[0]["states"][4:]                  # trainable from the start
        assert_equal_states(rank["weights"], ref["weights"])
        assert rank["optimizer"].keys() == ref["optimizer"].keys()
        for i, state in ref["optimizer"].items():
            assert_equal_states(rank["optimizer"][i], state)
