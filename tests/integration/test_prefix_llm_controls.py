"""The prefix LLM (encoder -> projector -> decoder-only LLM, ``experiment=audio_captioning_llm``
shrunk) under the training controls every mmtf task has, through ``python -m mmtf.train``:

* SIGKILLed mid-epoch with dropout, activation checkpointing of both parts and an EMA of the
  weights, ``ckpt_path=last`` ends bit for bit where the uninterrupted run ends (weights,
  optimizer, EMA, RNG, loops, tokenizer; chat template too);
* ``trainer=fsdp`` on two CPU ranks (gloo) trains it, validates with generation (the LLM's
  ``generate`` gathers its shards) and resumes from ``last``.

Tiny data: 12 training clips, batch 4 -> 3 optimizer steps per epoch.
"""

from __future__ import annotations

import csv
import signal

import pytest

from mmtf.checkpoint_io import EMA_STATE_KEY
from mmtf.train import train
from tests.unit.reliability.toy import run_forked

from .conftest import compose_train, tiny_overrides
from .test_fsdp_cli import train_then_resume
from .test_reliability import (  # noqa: F401  (_isolate_global_torch_state: an autouse fixture)
    EMA_ON,
    KillAtStep,
    Recorder,
    _isolate_global_torch_state,
    assert_same_final_state,
    cb,
    load,
)

pytestmark = pytest.mark.slow


def llm_overrides(data_dir, *extra: str) -> list[str]:
    """3 epochs (9 steps) of the tiny prefix LLM with dropout in both parts, activation
    checkpointing, an EMA, deterministic kernels and last.ckpt every 2 steps."""
    return tiny_overrides("audio_captioning_llm", data_dir, "test=false", "trainer.max_epochs=3",
                          "model.encoder.block.dropout=0.1", "model.decoder.dropout=0.1",
                          "model.encoder.activation_checkpointing=true",
                          "model.decoder.activation_checkpointing=true",
                          "trainer.deterministic=true",
                          "callbacks.periodic_checkpoint.every_n_train_steps=2", *EMA_ON, *extra)


def test_the_prefix_llm_killed_mid_epoch_resumes_bit_for_bit(data_dir, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    train(compose_train(llm_overrides(data_dir), ref))
    # Killed at the start of step 6's batch: last.ckpt of step 4 (epoch 1, 1 of 3 batches).
    code = run_forked(train, compose_train(llm_overrides(data_dir, *cb("kill", KillAtStep, step=5)),
                                           run), timeout=240)
    assert code == -signal.SIGKILL, f"the run was to be SIGKILLed, exit code {code}"
    assert load(run / "checkpoints" / "last.ckpt")["global_step"] == 4
    train(compose_train(llm_overrides(data_dir, "ckpt_path=last", *cb("rec", Recorder)), run))
    assert [r["start_step"] for r in Recorder.records] == [4]
    assert_same_final_state(ref, run)
    a, b = load(ref / "checkpoints" / "last.ckpt"), load(run / "checkpoints" / "last.ckpt")
    assert a["mmtf"]["chat_template"] == b["mmtf"]["chat_template"]
    # The EMA was really on: its average differs from the trained weights.
    ema = a[EMA_STATE_KEY]
    assert any(not ema[k].equal(v) for k, v in a["state_dict"].items() if k in ema)


def test_fsdp_trains_the_prefix_llm_and_resumes_from_last(data_dir, tmp_path):
    run_dir, checkpoint = train_then_resume("audio_captioning_llm", data_dir, tmp_path,
                                            "model.decoder.activation_checkpointing=true")
    # One full file: the LLM's blocks gathered from both ranks' shards.
    keys = checkpoint["state_dict"]
    assert any(".layers.0." in k or ".blocks.0." in k for k in keys), sorted(keys)[:10]
    # Validation generated replies and scored them in both runs (epochs 0 and 1).
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))
    scored = [(r["epoch"], float(r["val/event_accuracy"])) for r in rows
              if r.get("val/event_accuracy")]
    assert [e for e, _ in scored] == ["0", "1"] and all(0 <= v <= 1 for _, v in scored)
