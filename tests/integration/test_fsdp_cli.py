"""`python -m mmtf.train trainer=fsdp` on two CPU ranks (gloo): the captioner trains, validates with
generation, and `ckpt_path=last` resumes it in the same run dir with activation checkpointing on.
Both ranks are forked (tests/forked.py): rank 0 from the worker, rank 1 from rank 0 where
Lightning's launcher would start an interpreter."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
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


def once_more_if_a_rank_vanished(body: Callable[[Path], None], tmp_path: Path) -> None:
    """Run ``body(dir)``; if it failed because a rank's peer connection dropped, run it once
    more from scratch in a fresh dir, after a warning that carries the first failure.

    Why: in one CI run of ~2300 tests (two xdist workers on 2 cores) a resumed run died with
    rank 0 in a collective and rank 1 gone, which 20+ runs here (alone and under load) never
    showed. The warning keeps the first failure in CI's summary; a second failure fails, and
    any other failure fails at once."""
    try:
        body(tmp_path / "try1")
    except AssertionError as failure:
        if not LOST_PEER.search(str(failure)):
            raise
        warnings.warn(f"FSDP run lost a rank's connection; running once more:\n{failure}",
                      stacklevel=2)
        body(tmp_path / "try2")


def test_fsdp_trains_the_captioner_and_resumes_from_last(data_dir, tmp_path):
    once_more_if_a_rank_vanished(lambda root: _captioner_trains_and_resumes(data_dir, root),
                                 tmp_path)


def _captioner_trains_and_resumes(data_dir, tmp_path: Path) -> None:
    tmp_path.mkdir()
    run_dir = tmp_path / "run"
    args = [*tiny_overrides("audio_captioning", data_dir), *FSDP_CPU, f"hydra.run.dir={run_dir}"]
    first = run_main("mmtf.train", args, cwd=tmp_path, fork_ranks=True)
    assert first.returncode == 0, why(first)
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["epoch"] == 1
    resumed = run_main("mmtf.train", [*args, "trainer.max_epochs=2", "ckpt_path=last",
                                      "model.encoder.activation_checkpointing=true",
                                      "model.decoder.activation_checkpointing=true"],
                       cwd=tmp_path, fork_ranks=True)
    assert resumed.returncode == 0, why(resumed)
    assert "Restored all states" in resumed.stdout + resumed.stderr
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert checkpoint["epoch"] == 2
    assert "model.decoder.stack.blocks.0.self_attn.to_q.weight" in checkpoint["state_dict"]
