"""Checks the rest of the suite leaves out, on the real (tiny) audio-captioning task, each against
an independent reference:

* exact resume (SIGKILL mid-epoch, ``ckpt_path=last``) with loader workers and with gradient
  accumulation, bit for bit against an uninterrupted run;
* a finished run leaves ``last.ckpt`` at its final state, also when the last epoch has no
  validation (the uninterrupted and the killed-and-resumed run end with the same file);
* ``train()`` returns the best value of ``optimized_metric`` by ``optimized_mode``;
* ``mmtf.evaluate split=val`` scores the validation split, ``metrics_backend=aac`` scores with
  aac-metrics;
* ``mmtf.load(..., strategy="beam", num_beams=4)`` decodes with those options;
* ``caption()`` on ``(waveform, sample_rate)`` pairs resamples to the encoder's rate.

The kill/resume helpers and instruments are test_reliability's. Tiny data: 12 training clips,
batch 4 -> 3 optimizer steps per epoch.
"""

from __future__ import annotations

import csv
import json
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio
from lightning.pytorch.callbacks import ModelCheckpoint

import mmtf
from mmtf.train import optimized_value, train
from tests.unit.reliability.toy import run_forked

from .conftest import compose_train, evaluate_in_process, tiny_overrides
from .test_reliability import (  # noqa: F401  (_isolate_global_torch_state: an autouse fixture)
    KillAtStep,
    Recorder,
    _isolate_global_torch_state,
    assert_same_final_state,
    cb,
    exact_overrides,
    load,
)


# ---------------------------------------------------------------------------- helpers
def kill_and_resume(data_dir: Path, tmp_path: Path, *extra: str, kill_at: int,
                    ckpt_step: int) -> tuple[Path, Path]:
    """An uninterrupted run; the same run SIGKILLed at the start of the batch after ``kill_at``
    steps (its last.ckpt then at ``ckpt_step``) and resumed with ckpt_path=last. (ref, run)."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    train(compose_train(exact_overrides(data_dir, *extra), ref))
    code = run_forked(train, compose_train(exact_overrides(
        data_dir, *extra, *cb("kill", KillAtStep, step=kill_at)), run), timeout=240)
    assert code == -signal.SIGKILL, f"the run was to be SIGKILLed, exit code {code}"
    assert load(run / "checkpoints" / "last.ckpt")["global_step"] == ckpt_step
    train(compose_train(exact_overrides(data_dir, *extra, "ckpt_path=last",
                                        *cb("rec", Recorder)), run))
    assert [r["start_step"] for r in Recorder.records] == [ckpt_step]
    return ref, run


# ---------------------------------------------------------------------------- exact resume
@pytest.mark.slow
def test_mid_epoch_kill_with_loader_workers_resumes_exactly(data_dir, tmp_path):
    # last.ckpt of step 4 = epoch 1 after 1 of 3 batches; 2 workers prefetch past it
    ref, run = kill_and_resume(data_dir, tmp_path, "data.loader.num_workers=2", kill_at=5, ckpt_step=4)
    assert_same_final_state(ref, run)


@pytest.mark.slow
def test_mid_epoch_kill_with_gradient_accumulation_resumes_exactly(data_dir, tmp_path):
    # batch 2, 2 batches per optimizer step: 6 batches = 3 steps per epoch; last.ckpt of step 4
    # = epoch 1 after 2 of 6 batches (its second step); killed at step 5
    ref, run = kill_and_resume(data_dir, tmp_path, "data.batches.batch_size=2",
                               "trainer.accumulate_grad_batches=2", kill_at=5, ckpt_step=4)
    assert_same_final_state(ref, run)
    first = load(ref / "checkpoints" / "last.ckpt")["loops"]["fit_loop"]
    batches = first["epoch_loop.batch_progress"]["total"]["completed"]
    assert batches == 18                                   # 2 batches per step, really


# ---------------------------------------------------------------------------- last.ckpt at the end
@pytest.mark.slow
def test_last_ckpt_holds_the_final_state_when_the_last_epoch_is_not_validated(data_dir, tmp_path):
    """3 epochs, validation every 2nd (after epoch 1 only), last.ckpt every 2 steps: training
    ends at step 9 after the save of step 8. Killed at step 8 and resumed, the run ends with
    the same last.ckpt as the uninterrupted one: the state at step 9, loops included."""
    ref, run = kill_and_resume(data_dir, tmp_path, "trainer.check_val_every_n_epoch=2",
                               kill_at=8, ckpt_step=8)
    assert_same_final_state(ref, run)
    epochs = load(ref / "checkpoints" / "epoch_001.ckpt")
    assert epochs["global_step"] == 6                      # the one validation: after epoch 1


# ---------------------------------------------------------------------------- train() returns
def _logged(run_dir: Path, key: str) -> list[float]:
    """Every value of ``key`` in the run's CSV log, in order (an independent record)."""
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return [float(row[key]) for row in csv.DictReader(f) if row.get(key)]


@pytest.mark.slow
def test_train_returns_the_best_value_of_the_optimized_metric_not_the_last(data_dir, tmp_path):
    # Loss falls over 3 epochs: by mode=max its best is the first validation, the last is worse.
    value = train(compose_train(tiny_overrides(
        "audio_captioning", data_dir, "test=false", "trainer.max_epochs=3",
        "optimized_metric=val/loss", "optimized_mode=max"), tmp_path))
    history = _logged(tmp_path, "val/loss")
    assert len(history) == 3 and history[-1] < max(history), history
    assert value == pytest.approx(max(history), rel=1e-6)
    assert value != pytest.approx(history[-1], rel=1e-6)


def test_optimized_value_takes_the_best_only_from_a_checkpoint_of_that_metric_and_mode(caplog):
    def monitoring(monitor: str, mode: str, best: float) -> ModelCheckpoint:
        callback = ModelCheckpoint(monitor=monitor, mode=mode)
        callback.best_model_score = torch.tensor(best)
        return callback

    trainer = SimpleNamespace(checkpoint_callbacks=[
        monitoring("val/loss", "max", 5.0), monitoring("val/other", "min", 1.0),
        monitoring("val/loss", "min", 0.5)])
    logged = {"val/loss": 2.0, "test/loss": 3.0}
    assert optimized_value(trainer, logged, "val/loss", "min", once=set()) == 0.5
    assert optimized_value(trainer, logged, "val/loss", "max", once=set()) == 5.0
    assert caplog.text == ""
    trainer.checkpoint_callbacks = trainer.checkpoint_callbacks[1:2]
    with caplog.at_level("WARNING", logger="mmtf.train"):
        assert optimized_value(trainer, logged, "test/loss", "min", once={"test/loss"}) == 3.0
        assert caplog.text == ""                           # a test metric is logged once
        assert optimized_value(trainer, logged, "val/loss", "min", once=set()) == 2.0
    assert "optimized_metric=val/loss: no checkpoint callback monitors it with mode=min, so " \
           "train() returns its last value, not its best" in caplog.text
    assert optimized_value(trainer, logged, "val/missing", "min", once=set()) is None
    caplog.clear()
    unscored = ModelCheckpoint(monitor="val/loss", mode="min")      # fast_dev_run saves nothing
    trainer.checkpoint_callbacks = [unscored]
    with caplog.at_level("WARNING", logger="mmtf.train"):
        assert optimized_value(trainer, logged, "val/loss", "min", once=set()) == 2.0
    assert caplog.text == ""


# ---------------------------------------------------------------------------- a trained checkpoint
@pytest.fixture(scope="module")
def run_dir(data_dir, tmp_path_factory) -> Path:
    """One epoch, validated at its end (step 3): last.ckpt holds the weights validated."""
    out = tmp_path_factory.mktemp("gaps_run")
    train(compose_train(tiny_overrides("audio_captioning", data_dir, "test=false"), out))
    return out


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_evaluate_split_val_scores_the_validation_split(run_dir, data_dir, tmp_path):
    """The scores equal those of the run's own validation of the same weights (same batch size),
    and the predictions are the validation clips, not the test clips."""
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    val = evaluate_in_process(ckpt, tmp_path / "val", "split=val", "batch_size=4")
    test = evaluate_in_process(ckpt, tmp_path / "test", "split=test", "batch_size=4")
    logged = json.loads((run_dir / "metrics.json").read_text())
    names = [f"val/{n}" for n in ("bleu_1", "bleu_4", "rouge_l", "cider_d")]
    assert {n: val[n] for n in names} == pytest.approx({n: logged[n] for n in names}, abs=1e-6)
    assert all(k.startswith("val/") for k in val) and all(k.startswith("test/") for k in test)
    val_ids, test_ids = _ids(tmp_path / "val" / "predictions.jsonl"), _ids(
        tmp_path / "test" / "predictions.jsonl")
    assert len(val_ids) == len(test_ids) == 4 and not set(val_ids) & set(test_ids)
    assert {i.rsplit("_", 1)[0] for i in val_ids} == {"synth_validation"}, val_ids


@pytest.mark.slow
def test_evaluate_with_metrics_backend_aac_scores_with_aac_metrics(run_dir, tmp_path,
                                                                    monkeypatch):
    pytest.importorskip("aac_metrics")
    import mmtf.metrics.caption as caption_module

    monkeypatch.setenv("AAC_METRICS_CACHE_PATH", str(tmp_path / "aac"))  # nothing downloaded
    monkeypatch.setenv("FENSE_DATA", str(tmp_path / "fense"))
    calls: list[tuple[list[str], list[str]]] = []
    real = caption_module.aac_scores

    def spy(candidates, references, names, **kwargs):
        calls.append((list(candidates), list(names)))
        return real(candidates, references, names, **kwargs)

    monkeypatch.setattr(caption_module, "aac_scores", spy)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    ours = evaluate_in_process(ckpt, tmp_path / "mmtf")
    assert calls == []
    theirs = evaluate_in_process(ckpt, tmp_path / "aac", "metrics_backend=aac")
    predictions = [json.loads(line)["prediction"]
                   for line in (tmp_path / "aac" / "predictions.jsonl").read_text().splitlines()]
    assert len(calls) == 1 and len(calls[0][0]) == len(predictions) == 4
    names = [f"test/{n}" for n in ("bleu_1", "bleu_4", "rouge_l", "cider_d")]
    assert {n: theirs[n] for n in names} == pytest.approx({n: ours[n] for n in names},
                                                           rel=1e-6, abs=1e-9)
    # what needs aac-metrics' downloads is left out, never scored 0
    assert "test/spice" not in theirs and "test/spider" not in theirs


# ---------------------------------------------------------------------------- notebook API
class GenerateSpy:
    """Wraps ``task.model.generate``: records the inputs and options of every call."""

    def __init__(self, task: Any) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]] = []
        self.real = task.model.generate
        task.model.generate = self

    def __call__(self, inputs, lengths=None, **options):
        self.calls.append((inputs.clone(), None if lengths is None else lengths.clone(),
                           dict(options)))
        return self.real(inputs, lengths, **options)


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    """1.3 s of a chirp in noise at 16 kHz (the encoder's rate)."""
    rng = np.random.default_rng(0)
    t = np.arange(int(1.3 * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * (300 + 900 * t) * t)
            + rng.normal(0, 0.05, t.shape)).astype(np.float32)


@pytest.mark.slow
def test_load_keeps_its_generation_options_for_every_call(run_dir, clip):
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    model, _ = mmtf.load(ckpt, strategy="beam", num_beams=4)
    spy = GenerateSpy(model)
    first = model.caption([clip])
    second = model.caption([torch.from_numpy(clip)])
    assert [(o.get("strategy"), o.get("num_beams")) for *_, o in spy.calls] == [("beam", 4)] * 2
    plain, _ = mmtf.load(ckpt)
    assert plain.generation["strategy"] == "greedy"
    assert first == second == plain.caption([clip], strategy="beam", num_beams=4)


@pytest.mark.slow
def test_caption_resamples_waveform_and_rate_pairs(run_dir, clip, tmp_path):
    """A (waveform, 22050) pair reaches the encoder as torchaudio's resampling of it to 16 kHz,
    the same samples as the 22.05 kHz file and as the waveform resampled beforehand."""
    model, _ = mmtf.load(run_dir / "checkpoints" / "last.ckpt")
    assert model.model.encoder.sample_rate == 16000
    wave22 = torchaudio.functional.resample(torch.from_numpy(clip), 16000, 22050)
    path = tmp_path / "clip22.wav"
    sf.write(path, wave22.numpy(), 22050, subtype="FLOAT")
    reference = torchaudio.functional.resample(wave22, 22050, 16000)
    spy = GenerateSpy(model)
    pair, = model.caption([(wave22, 22050)])
    numpy_pair, = model.caption([(wave22.numpy(), 22050)])
    from_file, = model.caption([path])
    resampled, = model.caption([reference])
    model.caption([wave22])                                # control: taken as 16 kHz
    inputs = [x[0, : int(n[0])] for x, n, _ in spy.calls]
    assert inputs[0].shape == reference.shape
    for got in inputs[:4]:
        # (mmtf's cached Resample module and torchaudio's function round differently: ~5e-6 on
        # a 0.35 peak; resampling with another filter or rate is off by ~1e-2)
        torch.testing.assert_close(got, reference, rtol=0, atol=2e-5)
    assert inputs[4].shape == wave22.shape != reference.shape
    assert pair == numpy_pair == from_file == resampled
