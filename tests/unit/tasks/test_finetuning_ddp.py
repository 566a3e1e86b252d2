"""Unfreezing at an epoch under DDP on the CPU (gloo).

A world of one (forked, in-process): the rebuilt DDP wrapper's gradient buckets hold the unfrozen
encoder. Two ranks (slow, subprocesses): the unfrozen encoder's gradients are all-reduced (both
ranks end with the same weights though each trains on its own batches), and a run resumed past
the unfreeze epoch ends bit for bit where the uninterrupted run ended (gloo's sum of two ranks is
deterministic).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from tests.forked import run_main
from tests.unit.reliability.toy import run_forked

from .conftest import classifier, vision_encoder

SCRIPT = Path(__file__).with_name("ddp_unfreeze_script.py")
REPO = Path(__file__).resolve().parents[3]


class BucketParams(Callback):
    """Per epoch, the ids of the parameters in the DDP wrapper's gradient buckets (a comm hook
    on every new wrapper; it passes each bucket on unchanged)."""

    def __init__(self) -> None:
        # the wrappers themselves, not their id(): a freed wrapper's id can be reused by the next
        self.wrappers: list[torch.nn.Module] = []
        self.seen: dict[int, set[int]] = {}

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        ddp = trainer.strategy.model
        if any(w is ddp for w in self.wrappers):
            return
        self.wrappers.append(ddp)

        def hook(state, bucket):
            self.seen.setdefault(trainer.current_epoch, set()).update(map(id, bucket.parameters()))
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        ddp.register_comm_hook(None, hook)


LORA = {"r": 2, "alpha": 4, "parts": ["encoder"], "targets": ["q", "v"]}


def _fit_world_of_one(out: Path, lora: dict | None = None) -> None:
    """Forked child: a DDP fit on one CPU rank; writes {epoch: [encoder params, all params]}
    found in the gradient buckets."""
    # Lightning's DDP raises the thread count unless OMP_NUM_THREADS is set, and OpenMP's pool
    # does not survive a fork: the child would hang in its first convolution.
    os.environ["OMP_NUM_THREADS"] = "1"
    task = classifier(encoder=vision_encoder(freeze=True), unfreeze_encoder_at_epoch=1, lora=lora)
    buckets = BucketParams()
    g = torch.Generator().manual_seed(0)
    batches = [{"image": torch.rand(4, 3, 32, 32, generator=g), "label": torch.arange(4) % 3}
               for _ in range(2)]
    L.Trainer(strategy=DDPStrategy(process_group_backend="gloo"), accelerator="cpu", devices=1,
              max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, callbacks=[buckets]).fit(
        task, DataLoader(batches, batch_size=None))
    encoder = {id(p) for p in task.encoder.parameters()}
    out.write_text(json.dumps({epoch: [len(ids & encoder), len(ids)]
                               for epoch, ids in buckets.seen.items()}))


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_the_rebuilt_ddp_wrapper_all_reduces_the_unfrozen_encoder(tmp_path, lora):
    """With LoRA the unfrozen encoder's buckets hold its adapters (A and B of q and v in its
    one block) and nothing of its frozen base."""
    out = tmp_path / "buckets.json"
    assert run_forked(_fit_world_of_one, out, lora) == 0
    n_encoder = 4 if lora else len(list(vision_encoder().parameters()))
    # epoch 0: the head's weight and bias only; epoch 1: the encoder's parameters too
    assert json.loads(out.read_text()) == {"0": [0, 2], "1": [n_encoder, n_encoder + 2]}


def run(mode: str, out: Path) -> list[dict]:
    """Both ranks' saved end state of ``ddp_unfreeze_script.py MODE``."""
    # rank 0 forked from this worker, and rank 1 forked from rank 0 by Lightning (tests/forked.py)
    proc = run_main(SCRIPT, [mode, str(out)], cwd=REPO, env={"PYTHONPATH": str(REPO)}, timeout=300,
                    fork_ranks=True)
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
    resumed = run("resume", tmp_path)          # from full's checkpoint after epoch 1
    for rank, ref in zip(resumed, full):
        assert rank["states"] == full[0]["states"][4:]                  # trainable from the start
        assert_equal_states(rank["weights"], ref["weights"])
        assert rank["optimizer"].keys() == ref["optimizer"].keys()
        for i, state in ref["optimizer"].items():
            assert_equal_states(rank["optimizer"][i], state)
