"""`python -m mmtf.train trainer=fsdp` on two CPU ranks (gloo): the captioner trains, validates with
generation, and `ckpt_path=last` resumes it in the same run dir with activation checkpointing on.
Both ranks are forked (tests/forked.py): rank 0 from the worker, rank 1 from rank 0 where
Lightning's launcher would start an interpreter."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from mmtf.checkpoint_io import load_checkpoint
from tests.forked import run_main

from .conftest import tiny_overrides

pytestmark = pytest.mark.slow

FSDP_CPU = ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2",
            "trainer.precision=32-true", "trainer.strategy.process_group_backend=gloo",
            "test=false"]


def why(result) -> str:
    """A failed run's story across both ranks: each rank's error lines in order (the first
    failure is usually the other rank's, far above the tail), then the tail."""
    lines = (result.stdout + result.stderr).splitlines()
    errors = [line for line in lines
              if re.search(r"Rank \d|Error|error:|Fatal|terminate|Segmentation|signal", line)]
    return "\n".join(errors[:60]) + "\n--- tail ---\n" + result.stderr[-3000:]


# gloo's words when the other rank's socket went away (its process died mid-collective).
LOST_PEER = re.compile(r"Connection reset by peer|Connection closed by peer")


def train_then_resume(experiment: str, data_dir: Path, root: Path,
                      *resume_overrides: str) -> tuple[Path, dict]:
    """``trainer=fsdp`` on two gloo ranks: one epoch of the tiny ``experiment``, then
    ``ckpt_path=last`` with ``trainer.max_epochs=2`` and ``resume_overrides`` in the same run
    dir; the run dir and the final last.ckpt.

    Once more, from scratch in a fresh dir, if a run failed because a rank's peer connection
    dropped, after a warning that carries the first failure. Why: in one CI run of ~2300 tests
    (two xdist workers on 2 cores) a resumed run died with rank 0 in a collective and rank 1
    gone, which 20+ runs here (alone and under load) never showed. The warning keeps the first
    failure in CI's summary; a second failure fails, and any other failure fails at once."""
    try:
        return _train_then_resume(experiment, data_dir, root / "try1", resume_overrides)
    except AssertionError as failure:
        if not LOST_PEER.search(str(failure)):
            raise
        warnings.warn(f"FSDP run lost a rank's connection; running once more:\n{failure}",
                      stacklevel=2)
        return _train_then_resume(experiment, data_dir, root / "try2", resume_overrides)


def _train_then_resume(experiment: str, data_dir: Path, root: Path,
                       resume_overrides: tuple[str, ...]) -> tuple[Path, dict]:
    root.mkdir()
    run_dir = root / "run"
    args = [*tiny_overrides(experiment, data_dir), *FSDP_CPU, f"hydra.run.dir={run_dir}"]
    first = run_main("mmtf.train", args, cwd=root, fork_ranks=True)
    assert first.returncode == 0, why(first)
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["epoch"] == 1
    resumed = run_main("mmtf.train", [*args, "trainer.max_epochs=2", "ckpt_path=last",
                                      *resume_overrides], cwd=root, fork_ranks=True)
    assert resumed.returncode == 0, why(resumed)
    assert "Restored all states" in resumed.stdout + resumed.stderr
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert checkpoint["epoch"] == 2
    return run_dir, checkpoint


def test_fsdp_trains_the_captioner_and_resumes_from_last(data_dir, tmp_path):
    _, checkpoint = train_then_resume("audio_captioning", data_dir, tmp_path,
                                      "model.encoder.activation_checkpointing=true",
                                      "model.decoder.activation_checkpointing=true")
    assert "model.decoder.stack.blocks.0.self_attn.to_q.weight" in checkpoint["state_dict"]
