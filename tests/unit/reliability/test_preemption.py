"""SIGTERM -> last.ckpt at the end of the current batch, exit status 143, exact resume; DDP runs
that fail or are preempted end promptly with the right status."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from mmtf.reliability import PREEMPTED_EXIT_CODE, PreemptionCheckpoint
from tests.unit.reliability.toy import fit, max_abs_diff, run_forked

SCRIPT = Path(__file__).with_name("ddp_script.py")
REPO = Path(__file__).resolve().parents[3]


class TermAt(Callback):
    """Send this process SIGTERM at the start of training batch ``step`` (as a scheduler
    would, at an arbitrary point inside the batch)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("term_at, run, data, ckpt_step", [
    (8, {"max_steps": 15}, {}, 9),                                       # mid-epoch
    (5, {"max_epochs": 3}, {"val": True, "num_workers": 2, "noise": "sample"}, 6),  # last batch
])
def test_sigterm_saves_last_ckpt_exits_143_and_resumes_exactly(tmp_path, term_at, run, data,
                                                               ckpt_step):
    _, ref = fit(tmp_path / "ref", **run, **data)
    code = run_forked(fit, tmp_path / "run", extra_callbacks=[TermAt(term_at),
                                                              PreemptionCheckpoint()],
                      **run, **data)
    assert code == PREEMPTED_EXIT_CODE == 143
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == ckpt_step   # batch completed
    trainer, resumed = fit(tmp_path / "run", ckpt_path=str(last), **run, **data)
    assert trainer.global_step == (15 if "max_steps" in run else 18)
    assert max_abs_diff(ref, resumed) <= 1e-6


def test_without_the_callback_lightning_exits_0_and_saves_nothing(tmp_path):
    """Control: Lightning 2.6's own SIGTERM handling."""
    code = run_forked(fit, tmp_path, max_steps=15, extra_callbacks=[TermAt(8)])
    assert code == 0
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"filename": "last.pt"}, r"filename \('last.pt'\) must end with \.ckpt"),
    ({"exit_code": 300}, r"exit_code \(300\) must be in 0\.\.255"),
])
def test_preemption_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PreemptionCheckpoint(**kwargs)


# ---------------------------------------------------------------------------- DDP (subprocess)
def _procs_with(token: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if token in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="ignore"):
                found.append(int(pid))
        except OSError:
            pass
    return found


def run_ddp(out: Path, mode: str, rank: int, step: int, *, sigterm_after: str | None = None,
            timeout: float = 240) -> tuple[int, str, float | None, float]:
    """Run the 2-rank script; (exit code, output, seconds from the trigger to exit, total)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(SCRIPT), mode, str(rank), str(step), str(out)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines, trigger = [], None
    try:
        for line in proc.stdout:       # ends when every rank has closed its end of the pipe
            lines.append(line)
            if trigger is None and mode == "raise" and f"boom on rank {rank}" in line:
                trigger = time.monotonic()
            if trigger is None and sigterm_after and sigterm_after in line:
                proc.send_signal(signal.SIGTERM)           # to rank 0 only, like `kill <pid>`
                trigger = time.monotonic()
            if time.monotonic() - start > timeout:
                break
        code = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - start)))
    finally:
        proc.kill()
    end = time.monotonic()
    return code, "".join(lines), (end - trigger) if trigger else None, end - start


@pytest.mark.slow
@pytest.mark.parametrize("failing_rank", [1, 0])
def test_ddp_rank_failure_ends_the_job_promptly(tmp_path, failing_rank):
    """Rank 1 failing: Lightning's child observer kills the job. Rank 0 (the launcher)
    failing: DDPFailFast kills the children. Either way: non-zero, the error shown, no
    process left behind, well under a minute."""
    code, out, after, total = run_ddp(tmp_path, "raise", failing_rank, 3)
    print(f"rank {failing_rank} raises: exit {code}, {after:.1f} s from the error to exit "
          f"({total:.1f} s in all)")
    assert code != 0
    assert f"RuntimeError: boom on rank {failing_rank} at step 3" in out
    assert after is not None and after < 60, after
    assert _procs_with(str(tmp_path)) == []


@pytest.mark.slow
def test_ddp_sigterm_to_rank_0_checkpoints_on_both_ranks_and_exits_143(tmp_path):
    """Rank 1's loss is NaN at step 2 (both ranks skip it, no hang); SIGTERM to rank 0 after
    step 4: both ranks stop at the same batch, one last.ckpt with both ranks' RNG states."""
    code, out, after, total = run_ddp(tmp_path, "sigterm", 1, 2,
                                      sigterm_after="rank 0 done step 4")
    print(f"SIGTERM: exit {code}, {after:.1f} s from the signal to exit ({total:.1f} s in all)")
    assert code == PREEMPTED_EXIT_CODE, out[-3000:]
    assert "Skipped the optimizer step at global step 2" in out
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    # both ranks write to one pipe: a line may start mid-way through the other rank's output
    done = [int(step) for step in re.findall(r"rank 0 done step (\d+)", out)]
    assert ckpt["global_step"] == max(done) >= 4
    assert len(ckpt["callbacks"]["ResumeState"]["rng"]) == 2
    assert ckpt["callbacks"]["NonFiniteLossGuard"]["skipped"] == 1
    assert after is not None and after < 60, after
    assert _procs_with(str(tmp_path)) == []
