"""data=mixture end to end: two built-in sources (the second generated from another seed) with
per-source prompt tokens train, validate and test with every metric per source; SIGKILL in the
middle of an epoch and ``ckpt_path=last`` resume bit for bit; a bad weight is a one-line error
(exit 2); ``mmtf.data.check`` reports each source."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from mmtf.errors import ConfigError
from mmtf.synthetic import ensure_synthetic
from mmtf.train import train
from tests.unit.data.conftest import TINY_AUDIO, sine, write_audio
from tests.unit.reliability.toy import run_forked

from .conftest import (
    AUDIO,
    CAPTION,
    COMMON,
    cli_in_process,
    compose_train,
    evaluate_in_process,
    tiny_overrides,
)
from .test_reliability import (  # noqa: F401  (_isolate_global_torch_state: autouse here too)
    KillAtStep,
    Recorder,
    _isolate_global_torch_state,
    assert_equal_tensors,
    assert_same_final_state,
    cb,
    load,
)

SOURCES = {"synth_a": 12, "synth_b": 8}
HERE = "tests.integration.test_mixture"


class WeightsAtStart(Callback):
    """Save the task's weights when training starts (what a fine-tune starts from)."""

    def __init__(self, *, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
        torch.save(pl_module.state_dict(), self.path)


def mixture_overrides(data_dir: Path, *extra: str) -> list[str]:
    """The tiny audio-captioning run on data=mixture: 12 + 8 clips of 1-1.5 s, 4 + 4 val and
    test each, 12 examples per epoch (3 steps of 4)."""
    sources = [f"data.sources.{name}.synthetic.{key}={value}"
               for name, num_train in SOURCES.items()
               for key, value in (("num_train", num_train), ("num_val", 4), ("num_test", 4),
                                  ("min_seconds", 1.0), ("max_seconds", 1.5),
                                  ("num_workers", 0))]
    return ["experiment=audio_captioning", "data=synth_audio_captions_mix", f"paths.data_dir={data_dir}",
            *COMMON, *[a for a in AUDIO if not a.startswith("data.")], *CAPTION,
            "trainer.check_val_every_n_epoch=1", "data.epoch_samples=12", *sources, *extra]


@pytest.mark.slow
def test_a_two_source_mixture_trains_logs_every_metric_per_source_and_fine_tunes(data_dir,
                                                                                 tmp_path):
    out = tmp_path / "run"
    train(compose_train(mixture_overrides(data_dir, "trainer.max_epochs=2"), out))
    metrics = json.loads((out / "metrics.json").read_text())
    for split in ("val", "test"):
        for name in ("cider_d", "bleu_4", "rouge_l"):
            assert f"{split}/{name}" in metrics
            assert {f"{split}/synth_a/{name}", f"{split}/synth_b/{name}"} <= metrics.keys()
    ckpt = load(out / "checkpoints" / "last.ckpt")
    position = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    state = position["_index_sampler_state"]
    assert state["sources"] == ["synth_a", "synth_b"] and state["num_examples"] == 12
    tokenizer = json.loads(ckpt["mmtf"]["tokenizer"])
    assert tokenizer["prompt"] == ["<bos>", "<|synth_a|>"]      # the default source's token
    # generation started from each item's own prompt: synth_b's rows were scored too
    samples = sorted((out / "samples").glob("test_*.md"))
    assert "synth_b/" in samples[-1].read_text() and "synth_a/" in samples[-1].read_text()

    # mmtf.evaluate rebuilds the mixture from the checkpoint's config: per-source keys too
    scores = evaluate_in_process(out / "checkpoints" / "last.ckpt", tmp_path / "eval")
    assert {"test/synth_a/cider_d", "test/synth_b/cider_d", "test/cider_d"} <= scores.keys()

    # Stage 2: fine-tune on one built-in set from the mixture's weights and tokenizer.
    fine, start = tmp_path / "fine", tmp_path / "start.pt"
    train(compose_train(tiny_overrides(
        "audio_captioning", data_dir, f"init_from={out / 'checkpoints' / 'last.ckpt'}",
        f"+callbacks.w._target_={HERE}.WeightsAtStart", f"+callbacks.w.path={start}"), fine))
    started = torch.load(start, weights_only=True)
    assert_equal_tensors(started, ckpt["state_dict"], "weights at the fine-tune's start")
    tuned = load(fine / "checkpoints" / "last.ckpt")
    assert tuned["mmtf"]["tokenizer"] == ckpt["mmtf"]["tokenizer"]
    assert tuned["global_step"] == 3                  # a fresh run: its own loops and schedule
    with pytest.raises(ConfigError, match=r"init_from=.*last.ckpt: the checkpoint's weights do "
                                          r"not fit this model \(size mismatch for"):
        train(compose_train(tiny_overrides(
            "audio_captioning", data_dir, f"init_from={out / 'checkpoints' / 'last.ckpt'}",
            "model.decoder.dim=48"), tmp_path / "bad"))


@pytest.mark.slow
def test_sigkill_mid_epoch_on_a_mixture_then_ckpt_path_last_resumes_exactly(data_dir, tmp_path):
    """Reference run of 3 epochs (9 steps, random crops of 1.2 s from 1-1.5 s clips, dropout);
    the same run killed after step 5 (last.ckpt of step 4: epoch 1 after 1 of 3 batches);
    ckpt_path=last finishes it with the same weights, optimizer state and loops, bit for bit."""
    exact = ["test=false", "trainer.max_epochs=3", "model.encoder.block.dropout=0.1",
             "model.decoder.block.dropout=0.1", "trainer.deterministic=true",
             "callbacks.periodic_checkpoint.every_n_train_steps=2",
             "data.sources.synth_a.max_seconds=1.2", "data.sources.synth_b.max_seconds=1.2"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    train(compose_train(mixture_overrides(data_dir, *exact), ref))
    code = run_forked(train, compose_train(mixture_overrides(
        data_dir, *exact, *cb("kill", KillAtStep, step=5)), run), timeout=300)
    assert code == -signal.SIGKILL
    killed = load(run / "checkpoints" / "last.ckpt")
    position = killed["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (killed["global_step"], killed["epoch"]) == (4, 1)
    assert position["_index_sampler_state"]["epoch"] == 1 and position["_num_yielded"] == 1
    train(compose_train(mixture_overrides(data_dir, *exact, "ckpt_path=last",
                                          *cb("rec", Recorder)), run))
    assert [r["start_step"] for r in Recorder.records] == [4]
    assert_same_final_state(ref, run)


def test_a_weight_of_zero_is_a_one_line_error_with_exit_status_2(data_dir, tmp_path):
    out = cli_in_process("mmtf.train", [*mixture_overrides(data_dir),
                                        "data.sources.synth_b.weight=0",
                                        f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                         env={"HYDRA_FULL_ERROR": "0"})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "data.sources.synth_b (synth_b): weight (0) must be a number > 0" in out.stderr
    assert len([line for line in out.stderr.splitlines() if "mmtf: error" in line]) == 1


def test_data_check_reports_each_source(data_dir, tmp_path):
    sources = [a for a in mixture_overrides(data_dir) if a.startswith("data.sources.")]
    out = cli_in_process("mmtf.data.check", ["data=synth_audio_captions_mix", f"paths.data_dir={data_dir}",
                                             "tokenizer.vocab_size=128", *sources],
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "mmtf data check: mixture of 2 sources (audio, captions)" in text
    assert "source synth_a: weight 0.500 (12 train items)" in text
    assert "source synth_b: weight 0.500 (8 train items)" in text
    assert text.count("mmtf data check: clotho (audio, captions)") == 2
    assert text.count("OK: no problems found") == 2
    assert "OK: 0 problem(s) over the sources" in text


def write_audiocaps(root: Path) -> Path:
    """The AudioCaps layout: {split}.csv (audiocap_id,youtube_id,start_time,caption) + audio/."""
    for split in ("train", "val", "test"):
        rows = ["audiocap_id,youtube_id,start_time,caption"]
        for k in range(4):
            write_audio(root / "audio" / split / f"{split}{k}.wav", sine(1.0 + k / 8, 16000))
            rows += [f"{split}{k}{j},{split}{k},30,a tone number {k} take {j}" for j in range(2)]
        (root / f"{split}.csv").write_text("\n".join(rows) + "\n")
    return root


def write_wavcaps(root: Path) -> Path:
    """WavCaps as a manifest: train.jsonl only (the experiment does not evaluate on it)."""
    lines = []
    for k in range(6):
        write_audio(root / "clips" / f"{k}.flac", sine(1.0 + k / 10, 32000, hz=300 + 50 * k),
                    32000)
        lines.append(json.dumps({"audio": f"clips/{k}.flac", "caption": f"a hum at step {k}"}))
    (root / "train.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.slow
def test_the_pretrain_mix_experiment_runs_on_audiocaps_wavcaps_and_clotho_layouts(data_dir,
                                                                                  tmp_path):
    clotho = ensure_synthetic(tmp_path / "clotho", "audio_captions", **TINY_AUDIO)
    roots = {"audiocaps": write_audiocaps(tmp_path / "audiocaps"),
             "wavcaps": write_wavcaps(tmp_path / "wavcaps"), "clotho": clotho}
    overrides = ["experiment=audio_captioning_pretrain_mix", f"paths.data_dir={data_dir}",
                 *COMMON, *[a for a in AUDIO if not a.startswith("data.")], *CAPTION,
                 "trainer.fast_dev_run=true", "data.batches.eval_batch_size=16",
                 *(f"data.sources.{name}.root={root}" for name, root in roots.items())]
    out = tmp_path / "run"
    train(compose_train(overrides, out))
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"test/clotho/cider_d", "test/audiocaps/cider_d", "test/cider_d"} <= metrics.keys()
    assert not any(k.startswith("test/wavcaps/") for k in metrics)       # evaluate: false
    tokenizer = json.loads(load(out / "checkpoints" / "last.ckpt")["mmtf"]["tokenizer"])
    assert tokenizer["prompt"] == ["<bos>", "<|clotho|>"]                 # data.default_source
