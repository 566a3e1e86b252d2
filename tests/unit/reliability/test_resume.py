"""resolve_resume: ckpt_path=last|auto|<file> -> a verified checkpoint, or an error that says
what is wrong and what to do."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from mmtf.errors import ResumeError
from mmtf.reliability import find_checkpoints, resolve_resume, verify_resumable
from tests.unit.reliability.test_checkpoint_io import checkpoint


def write(path: Path, step: int, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint(step, 8), path)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_no_ckpt_path_starts_fresh(tmp_path):
    assert resolve_resume(None, tmp_path) is None
    assert resolve_resume("", tmp_path) is None


def test_last_with_nothing_to_resume_is_an_error(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ResumeError, match=r"ckpt_path=last but .*checkpoints holds no \*\.ckpt"
                                          r".*nothing to resume. Pass hydra.run.dir="):
        resolve_resume("last", tmp_path)


def test_auto_with_nothing_to_resume_starts_fresh(tmp_path):
    assert resolve_resume("auto", tmp_path) is None


def test_newest_checkpoint_wins_and_last_wins_ties(tmp_path):
    ckpts = tmp_path / "checkpoints"
    t = time.time() - 100
    write(ckpts / "epoch_001.ckpt", 1, t)
    write(ckpts / "last.ckpt", 2, t + 10)
    write(ckpts / "epoch_002.ckpt", 2, t + 10)           # same time as last.ckpt
    assert resolve_resume("last", tmp_path) == str(ckpts / "last.ckpt")
    hpc = write(tmp_path / "hpc_ckpt_1.ckpt", 3, t + 20)  # Lightning's SLURM requeue save
    assert resolve_resume("auto", tmp_path) == str(hpc)
    assert [p.name for p in find_checkpoints(tmp_path)] == [
        "hpc_ckpt_1.ckpt", "last.ckpt", "epoch_002.ckpt", "epoch_001.ckpt"]


def _naive_slow_save(path: str, half: mp.synchronize.Event) -> None:
    """torch.save straight onto the target (what a non-atomic writer does), slowly."""
    buf = io.BytesIO()
    torch.save(checkpoint(2), buf)
    data = buf.getvalue()
    with open(path, "wb") as f:
        for i in range(0, len(data), 4096):
            f.write(data[i:i + 4096])
            f.flush()
            if i >= len(data) // 2:
                half.set()
            time.sleep(0.01)


def test_truncated_last_ckpt_is_named_with_the_older_alternative(tmp_path):
    """Control for AtomicCheckpointIO: a writer killed while writing the target in place
    leaves a truncated last.ckpt; resuming from it fails early, naming the file and the fix."""
    ckpts = tmp_path / "checkpoints"
    older = write(ckpts / "epoch_000.ckpt", 1, time.time() - 100)
    last = write(ckpts / "last.ckpt", 1)
    ctx = mp.get_context("fork")
    half = ctx.Event()
    child = ctx.Process(target=_naive_slow_save, args=(str(last), half))
    child.start()
    assert half.wait(60)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    with pytest.raises(ResumeError, match=rf"checkpoint {last} \(\d+ bytes\) is corrupt .*cut off "
                                          rf"by a crash.* An older checkpoint exists: pass "
                                          rf"ckpt_path={older}"):
        resolve_resume("last", tmp_path)
    with pytest.raises(ResumeError, match=r"is corrupt"):
        resolve_resume(str(last), tmp_path)


def test_weights_only_export_cannot_resume(tmp_path):
    path = tmp_path / "weights.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}}, path)
    with pytest.raises(ResumeError, match=r"cannot resume training: it lacks \['loops', "
                                          r"'optimizer_states', 'global_step', 'epoch'\]"):
        resolve_resume(str(path), tmp_path)


def test_missing_explicit_path(tmp_path):
    with pytest.raises(ResumeError, match=r"nope.ckpt does not exist; pass ckpt_path="):
        resolve_resume(str(tmp_path / "nope.ckpt"), tmp_path)


def test_verify_reports_step_and_epoch_of_a_real_lightning_checkpoint(tmp_path):
    from tests.unit.reliability.toy import fit

    fit(tmp_path, max_steps=5, every_n_train_steps=5)
    assert verify_resumable(tmp_path / "checkpoints" / "last.ckpt") == {"global_step": 5,
                                                                       "epoch": 0}
