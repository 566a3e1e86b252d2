"""The training path end to end on tiny versions of every experiment."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from mmtf.checkpoint_io import load_checkpoint
from mmtf.errors import CheckpointError
from mmtf.text import BPETokenizer, Tokenizer, build_tokenizer
from mmtf.train import connect_tokenizer, train

from .conftest import EXPERIMENTS, TINY, compose_train, tiny_overrides

REAL_DATA = {  # real-format experiments read the tiny synthetic sets, written in those formats
    "audio_captioning_clotho": ("audio_captioning", "synth_audio_captions", []),
    "image_captioning_coco": ("image_captioning", "synth_image_captions", ["data.splits=null"]),
    "audio_text_retrieval_clotho": ("audio_text_retrieval", "synth_audio_captions", []),
}


def test_every_experiment_is_covered():
    # my_*: templates for a user's manifest, trained in test_own_data.py
    # audio_captioning_clotho_whisper: test_whisper_experiment.py (a saved tiny Whisper)
    # image_captioning_coco_vit_gpt2: on tiny pretrained folders in test_vit_gpt2.py
    # asr_*: a saved tiny Whisper on LibriSpeech / Common Voice layouts in test_asr.py
    # audio_captioning_pretrain_mix: AudioCaps + WavCaps + Clotho layouts in test_mixture.py
    assert set(EXPERIMENTS) == set(TINY) | set(REAL_DATA) | {"audio_captioning_audiocaps",
                                                             "my_audio_captions", "my_image_captions",
                                                             "audio_captioning_clotho_whisper",
                                                             "image_captioning_coco_vit_gpt2",
                                                             "asr_librispeech", "asr_common_voice",
                                                             "asr_manifest",
                                                             "audio_captioning_pretrain_mix"}


@pytest.mark.parametrize("experiment", sorted(TINY))
def test_experiment_fast_dev_run(experiment, data_dir, tmp_path):
    cfg = compose_train(tiny_overrides(experiment, data_dir, "trainer.fast_dev_run=true"),
                        tmp_path)
    train(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert any(k.startswith("test/") for k in metrics), metrics
    assert all(v == v for v in metrics.values())       # no NaN


@pytest.mark.parametrize("experiment, metric", [
    ("audio_captioning_llm", "event_accuracy"), ("image_captioning_llm", "event_accuracy"),
    ("audio_qa_llm", "mean_accuracy")])
def test_llm_experiment_one_epoch_on_the_real_data_module(experiment, metric, data_dir, tmp_path):
    """The shipped *_llm commands on the instruction data path (no stand-in module): one
    epoch, then generation-scored validation and test, the questions by their choices."""
    cfg = compose_train(tiny_overrides(experiment, data_dir), tmp_path)
    assert cfg.data._target_ == "mmtf.synthetic.SyntheticCaptionDataModule"
    train(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    for split in ("val", "test"):
        assert 0.0 <= metrics[f"{split}/{metric}"] <= 1.0, sorted(metrics)
    if experiment == "audio_qa_llm":       # questions are no captions: no caption scores
        assert "test/cider_d" not in metrics and metrics["test/items"] > 0


@pytest.mark.parametrize("experiment", sorted(REAL_DATA))
def test_real_format_experiment_fast_dev_run(experiment, data_dir, tmp_path):
    synthetic_experiment, folder, extra = REAL_DATA[experiment]
    # Generate the tiny synthetic set (in the real layout), then read it as the real corpus.
    train(compose_train(tiny_overrides(synthetic_experiment, data_dir, "trainer.fast_dev_run=true",
                                       "train=false", "test=false"), tmp_path / "gen"))
    prepared = compose_train(tiny_overrides(synthetic_experiment, data_dir), tmp_path / "x")
    dm = instantiate(prepared.data)
    dm.prepare_data()
    root = dm.root
    overrides = tiny_overrides(synthetic_experiment, data_dir, "trainer.fast_dev_run=true")
    overrides = [o for o in overrides if not o.startswith(("experiment=", "data.synthetic."))]
    cfg = compose_train([f"experiment={experiment}", *overrides, f"data.root={root}",
                         "model/encoder=" + ("audio_tiny" if "audio" in experiment
                                             else "vision_tiny"), *extra], tmp_path)
    assert "synthetic" not in cfg.data and folder in str(root)
    train(cfg)
    assert (tmp_path / "metrics.json").is_file()


def test_optimizer_steps_reduce_the_loss(data_dir, tmp_path):
    cfg = compose_train(tiny_overrides("audio_captioning", data_dir, "model.label_smoothing=0.0"),
                        tmp_path)
    task = instantiate(cfg.model)
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    connect_tokenizer(cfg, task, dm, None)
    batch = next(iter(dm.train_dataloader()))
    opt = torch.optim.AdamW(task.parameters(), lr=1e-2)
    task.train()
    losses = []
    for _ in range(40):
        loss = task.model(batch["audio"], batch["audio_lengths"], batch["tokens"]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_resume_from_last_continues_the_step_count(data_dir, tmp_path, monkeypatch):
    trained = []
    train_bpe = BPETokenizer.train.__func__
    monkeypatch.setattr(BPETokenizer, "train", classmethod(
        lambda cls, *a, **k: trained.append(1) or train_bpe(cls, *a, **k)))
    first = compose_train(tiny_overrides("audio_captioning", data_dir, "test=false"), tmp_path)
    train(first)
    assert len(trained) == 1                             # a fresh run trains its tokenizer once
    last = tmp_path / "checkpoints" / "last.ckpt"
    steps_one_epoch = load_checkpoint(last)["global_step"]
    assert steps_one_epoch == 3                          # 12 clips / batch 4
    resumed = compose_train(tiny_overrides("audio_captioning", data_dir, "test=false",
                                           "ckpt_path=last", "trainer.max_epochs=2"), tmp_path)
    train(resumed)
    state = load_checkpoint(last)
    assert state["global_step"] == 2 * steps_one_epoch
    assert len(trained) == 1                             # the resume took the checkpoint's


def test_ckpt_path_last_without_a_checkpoint_is_an_error(data_dir, tmp_path):
    cfg = compose_train(tiny_overrides("audio_captioning", data_dir, "ckpt_path=last"), tmp_path)
    with pytest.raises(ValueError, match=r"ckpt_path=last but .*last.ckpt does not exist"):
        train(cfg)


def _fit(cfg, ckpt_path=None, **kw):
    """``trainer.fit`` in-process on the composed task and data, which stay inspectable, with
    the tokenizer resolved as ``mmtf.train`` does."""
    task, dm = instantiate(cfg.model), instantiate(cfg.data)
    connect_tokenizer(cfg, task, dm, ckpt_path)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, **kw.pop("trainer", {}))
    trainer.fit(task, datamodule=dm, weights_only=True, ckpt_path=ckpt_path, **kw)
    return task, dm, trainer


def test_fresh_fit_trains_the_tokenizer_from_the_training_captions(data_dir, tmp_path):
    cfg = compose_train(tiny_overrides("audio_captioning", data_dir), tmp_path)
    task, dm, _ = _fit(cfg, trainer={"max_steps": 1})
    control = BPETokenizer.train(instantiate(cfg.data).train_captions(), vocab_size=128)
    assert task.tokenizer is dm.tokenizer and task.tokenizer == control


def test_resume_uses_the_checkpoint_tokenizer_whatever_the_config_says(data_dir, tmp_path):
    first = compose_train(tiny_overrides("audio_captioning", data_dir), tmp_path)
    _, _, trainer = _fit(first, trainer={"max_steps": 1})
    trainer.save_checkpoint(tmp_path / "one_step.ckpt", weights_only=False)
    stored = Tokenizer.from_json_str(
        load_checkpoint(tmp_path / "one_step.ckpt")["mmtf"]["tokenizer"])
    changed = compose_train(tiny_overrides("audio_captioning", data_dir,
                                           "tokenizer.vocab_size=60",
                                           "model.decoder.vocab_size=128"), tmp_path / "b")
    fresh = instantiate(changed.data)
    assert build_tokenizer(changed.tokenizer, fresh.train_captions) != stored  # control
    task, dm, trainer = _fit(changed, trainer={"max_steps": 2},
                             ckpt_path=str(tmp_path / "one_step.ckpt"))
    assert trainer.global_step == 2
    assert task.tokenizer is dm.tokenizer and task.tokenizer == stored
    limit = dm.max_caption_tokens
    assert dm.tokens("train") == [stored.encode_batch(item.captions, max_len=limit)
                                  for item in dm.items("train")]
    # A task and data handed another tokenizer than the checkpoint's are refused, clearly.
    task, dm = instantiate(changed.model), instantiate(changed.data)
    connect_tokenizer(changed, task, dm, None)                  # a fresh 60-token one
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, max_steps=2)
    with pytest.raises(CheckpointError, match=r"checkpoint's tokenizer differs from the one "
                                              r"this task \(and its data\) were given"):
        trainer.fit(task, datamodule=dm, ckpt_path=str(tmp_path / "one_step.ckpt"),
                    weights_only=True)
