"""Duration batching through the real (tiny) audio-captioning run: ``data.batches.batch_size=null
data.batches.max_seconds_per_batch=4.2`` trains with batches of 1-3 clips (1-1.5 s each) under the
budget, the same number every epoch as the LR schedule was built on; SIGKILLed mid-epoch and
resumed with ``ckpt_path=last``, it ends bit for bit where the uninterrupted run does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Callback

from mmtf.train import train

from .conftest import compose_train
from .test_gaps import kill_and_resume
from .test_reliability import (  # noqa: F401  (_isolate_global_torch_state: an autouse fixture)
    _isolate_global_torch_state,
    assert_equal_tensors,
    cb,
    exact_overrides,
    load,
)

BUDGET = 4.2
DURATION = ("data.batches.batch_size=null", f"data.batches.max_seconds_per_batch={BUDGET}")


class BatchShapes(Callback):
    """Append ``[epoch, batch_idx, b, s, num_training_batches]`` of every training batch and
    ``["val", b, s]`` of every validation batch to ``path`` (JSON lines)."""

    def __init__(self, *, path: str) -> None:
        self.path = path

    def _write(self, row: list) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._write([trainer.current_epoch, batch_idx, *batch["audio"].shape,
                     trainer.num_training_batches])

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx,
                                  dataloader_idx=0) -> None:
        self._write(["val", *batch["audio"].shape])


def shapes_cb(path: Path) -> list[str]:
    return [f"+callbacks.shapes._target_={__name__}.BatchShapes",
            f"+callbacks.shapes.path={json.dumps(str(path))}"]


@pytest.mark.slow
def test_a_run_batched_by_duration_keeps_the_budget_and_one_count_per_epoch(data_dir, tmp_path):
    log = tmp_path / "shapes.jsonl"
    cfg = compose_train(exact_overrides(data_dir, *DURATION, *shapes_cb(log)), tmp_path / "run")
    train(cfg)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    train_rows = [r for r in rows if r[0] != "val"]
    sr = cfg.data.sample_rate
    per_epoch = {e: [r for r in train_rows if r[0] == e] for e in range(3)}
    count = train_rows[0][4]                         # what the loop (and the LR schedule) used
    assert [len(per_epoch[e]) for e in range(3)] == [count] * 3
    assert {r[2] for r in train_rows} >= {2, 3}      # the budget sets the batch size
    assert all(b * s <= BUDGET * sr for _, _, b, s, _ in train_rows)
    # 12 clips an epoch; each batch's clips are whole (no crop under 10 s)
    assert all(sum(r[2] for r in per_epoch[e]) == 12 for e in range(3))
    val = [r for r in rows if r[0] == "val"]
    assert val and all(b * s <= BUDGET * sr for _, b, s in val)
    last = load(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 3 * count
    sched = last["lr_schedulers"][0]
    assert sched["last_epoch"] == 3 * count          # stepped once per batch


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_is_exact_with_duration_batches(data_dir, tmp_path):
    """With mixup on (its pairs depend on the batch the budget cut) and 2 captions per clip.
    The epoch has 6 batches, so last.ckpt of step 4 is mid-epoch 0."""
    extra = (*DURATION, "data.augment.mixup.p=0.5", "data.captions_per_item=2")
    ref, run = kill_and_resume(data_dir, tmp_path, *extra, kill_at=5, ckpt_step=4)
    a, b = load(ref / "checkpoints" / "last.ckpt"), load(run / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] and a["epoch"] == b["epoch"] == 3
    per_epoch = a["global_step"] // 3
    assert per_epoch == 6 and a["global_step"] == 3 * per_epoch
    assert_equal_tensors(a["loops"], b["loops"], "loops")
    assert_equal_tensors(a["state_dict"], b["state_dict"], "state_dict")
    assert_equal_tensors(a["optimizer_states"], b["optimizer_states"], "optimizer_states")
    assert a["lr_schedulers"] == b["lr_schedulers"]
    assert_equal_tensors(a["callbacks"]["ResumeState"], b["callbacks"]["ResumeState"], "rng")
