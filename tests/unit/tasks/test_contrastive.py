"""ContrastiveTask on a tiny in-memory set: the loss falls and zero-shot labels follow, the
temperature sits in its own undecayed group, validation scores every caption of every item,
fine-tuning controls apply to both towers, and a resumed run ends where an uninterrupted one
ends."""

from __future__ import annotations

import math
from functools import partial

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader

from mmtf.data.collate import pad_1d
from mmtf.errors import ConfigError, UserError
from mmtf.losses import item_keys
from mmtf.metrics.retrieval import retrieval_metrics
from mmtf.nn import TransformerStack
from mmtf.tasks import ContrastiveTask
from mmtf.tasks.ema import EMA
from mmtf.text import CharTokenizer

from .conftest import ADAMW, audio_encoder, fake_datamodule

SLOWER = partial(torch.optim.AdamW, lr=3e-3)    # 1e-2 overshoots on this set

NAMES = ["alpha", "bravo", "delta", "kilo", "lima", "oscar", "romeo", "zulu"]
CAPTIONS = [[f"sound {n}", f"{n} noise"] for n in NAMES]      # two per item
SR, SECONDS = 16000, 0.25


class TinyText(nn.Module):
    """The text-tower contract (mmtf.encoders.TextEncoder's): embed(ids, mask) -> (b, d)."""

    def __init__(self, vocab_size: int = 64, dim: int = 32) -> None:
        super().__init__()
        self.vocab_size, self.embed_dim, self.max_tokens = vocab_size, dim, 48
        self.tokens = nn.Embedding(vocab_size, dim)
        self.stack = TransformerStack(depth=1, dim=dim, num_heads=4, rope=True)

    def embed(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.stack(self.tokens(ids), key_mask=mask)                    # (b, n, d)
        weight = mask[..., None].float()
        return (x * weight).sum(1) / weight.sum(1)                         # (b, d)


def _tokenizer() -> CharTokenizer:
    return CharTokenizer.train([c for caps in CAPTIONS for c in caps])


def _waves() -> torch.Tensor:
    """One tone per item over a little noise, (8, samples): 250 mel apart (HTK), more than a
    band of the encoder's 16 mel bands (~180 mel each up to 8 kHz), 214 Hz to 2.7 kHz."""
    g = torch.Generator().manual_seed(0)
    t = torch.arange(int(SR * SECONDS)) / SR
    hz = [700 * (10 ** ((300 + 250 * i) / 2595) - 1) for i in range(len(NAMES))]
    tones = torch.stack([torch.sin(2 * math.pi * f * t) for f in hz])
    return 0.3 * tones + 0.01 * torch.randn(tones.shape, generator=g)


def _batches(tokenizer: CharTokenizer, items: list[int]) -> list[dict]:
    """Batches of 4 items as the caption collate lays them out (k = 2 captions, item-major)."""
    waves = _waves()
    out = []
    for start in range(0, len(items), 4):
        rows = items[start:start + 4]
        tokens, lengths = pad_1d(tokenizer.encode_batch([c for i in rows for c in CAPTIONS[i]]),
                                 tokenizer.pad_id, dtype=torch.long)
        out.append({"audio": waves[rows], "audio_lengths": torch.full((len(rows),), waves.shape[1]),
                    "tokens": tokens, "token_lengths": lengths,
                    "references": [CAPTIONS[i] for i in rows], "ids": [NAMES[i] for i in rows]})
    return out


def _task(tokenizer: CharTokenizer, **kw) -> ContrastiveTask:
    torch.manual_seed(0)
    # no SpecAugment, no dropout: the runs below are deterministic
    task = ContrastiveTask(encoder=audio_encoder(freq_masks=0, time_masks=0),
                           text_encoder=TinyText(), optimizer=SLOWER, embed_dim=16,
                           warmup_steps=0, **kw)
    task.use_tokenizer(tokenizer)
    return task


def _trainer(**kw) -> L.Trainer:
    return L.Trainer(**{"accelerator": "cpu", "logger": False, "enable_checkpointing": False,
                        "enable_progress_bar": False, "enable_model_summary": False,
                        "num_sanity_val_steps": 0, "deterministic": True, **kw})


@torch.no_grad()
def _full_loss(task: ContrastiveTask, tokenizer: CharTokenizer) -> float:
    """The loss of all 8 items (16 captions) in one batch, in eval mode."""
    task.eval()
    batch = _batches(tokenizer, list(range(8)))
    b = {**batch[0], **{k: [*batch[0][k], *batch[1][k]] for k in ("references", "ids")}}
    waves = torch.cat([x["audio"] for x in batch])
    media = task.embed_media(waves, torch.full((8,), waves.shape[1]))
    text = task.embed_texts([c for caps in b["references"] for c in caps])
    keys = torch.arange(8)
    loss = float(task.contrastive(media, text, keys, keys.repeat_interleave(2)))
    task.train()
    return loss


def test_training_lowers_the_loss_and_zero_shot_follows(tmp_path):
    tokenizer = _tokenizer()
    task = _task(tokenizer)
    before = _full_loss(task, tokenizer)
    trainer = _trainer(max_epochs=30, default_root_dir=tmp_path)
    trainer.fit(task, DataLoader(_batches(tokenizer, [0, 5, 2, 7, 4, 1, 6, 3]), batch_size=None))
    after = _full_loss(task, tokenizer)
    assert before > 1.5 and after < 0.5 * before, (before, after)
    # the temperature trained, alone in a group without weight decay
    groups = {g["name"]: g for g in trainer.optimizers[0].param_groups}
    assert [p is task.contrastive.logit_scale for p in groups["logit_scale.no_decay"]["params"]] \
        == [True]
    assert groups["logit_scale.no_decay"]["weight_decay"] == 0.0
    assert float(task.contrastive.logit_scale.detach()) != pytest.approx(math.log(1 / 0.07))
    # zero-shot: each clip's best prompt "sound <its name>"
    task.eval()
    with torch.no_grad():
        waves = _waves()
        media = task.embed_media(waves, torch.full((8,), waves.shape[1]))
    got = task.zero_shot_classify(media, NAMES, template="sound {label}")
    assert got.labels == NAMES and got.scores.shape == (8, 8)
    # 8 of 8 here; 6 leaves room for another CPU's rounding over 60 steps (chance: 1 of 8)
    assert (got.predictions == torch.arange(8)).sum() >= 6, got.predictions


def test_validation_scores_every_caption_of_every_item():
    tokenizer = _tokenizer()
    task = _task(tokenizer)
    batches = _batches(tokenizer, [0, 1, 2, 3, 4, 5])       # batches of 4 and 2 items
    got = _trainer().validate(task, DataLoader(batches, batch_size=None), verbose=False)[0]
    # the same scores from embeddings made here: 6 clips x 12 captions
    task.eval()
    with torch.no_grad():
        waves = _waves()[:6]
        media = task.embed_media(waves, torch.full((6,), waves.shape[1]))
        text = task.embed_texts([c for caps in CAPTIONS[:6] for c in caps])
    scores = text @ media.T                                                   # (12, 6)
    relevant = torch.arange(6).repeat_interleave(2)[:, None] == torch.arange(6)[None, :]
    for direction, (s, rel) in {"text_to_audio": (scores, relevant),
                                "audio_to_text": (scores.T, relevant.T)}.items():
        for name, value in retrieval_metrics(s, rel).items():
            assert got[f"val/{direction}/{name}"] == pytest.approx(value, abs=1e-6), name
    assert "val/loss" in got


@pytest.mark.parametrize("pooling", ["mean", "attention"])
def test_a_clip_embeds_the_same_alone_and_padded_in_a_batch(pooling):
    task = _task(_tokenizer(), pooling=pooling).eval()
    waves = _waves()
    short = waves[0, :2000]
    with torch.no_grad():
        alone = task.embed_media(short[None], torch.tensor([2000]))
        padded = task.embed_media(torch.stack([torch.cat([short, waves[1, 2000:]]), waves[1]]),
                                  torch.tensor([2000, waves.shape[1]]))
    torch.testing.assert_close(padded[0], alone[0], rtol=1e-5, atol=1e-5)
    assert float(alone.norm()) == pytest.approx(1.0)


def test_finetuning_controls_reach_both_towers(tmp_path):
    tokenizer = _tokenizer()
    task = _task(tokenizer, finetuning={"freeze_text_encoder": True, "encoder_lr_scale": 0.5,
                                        "unfreeze_text_encoder_at_epoch": 1},
                 lora={"r": 2, "parts": ["encoder"], "targets": ["q", "v"]})
    assert not any(p.requires_grad for p in task.text_encoder.parameters())
    trainer = _trainer(max_epochs=1, default_root_dir=tmp_path, callbacks=[EMA(decay=0.5)])
    batches = _batches(tokenizer, list(range(8)))
    trainer.fit(task, DataLoader(batches, batch_size=None), DataLoader(batches, batch_size=None))
    assert "val/text_to_audio/mAP@10" in trainer.callback_metrics      # scored on the average
    names = {g["name"]: g["lr_scale"] for g in trainer.optimizers[0].param_groups}
    assert names["encoder"] == 0.5
    trainable = {n for n, p in task.encoder.named_parameters() if p.requires_grad}
    assert trainable and all("lora" in n for n in trainable)
    with pytest.raises(ConfigError, match=r"model.finetuning.freeze_decoder is not a "
                                          r"fine-tuning control"):
        _task(tokenizer, finetuning={"freeze_decoder": True})


def test_bad_settings_and_data_are_one_line_errors():
    tokenizer = _tokenizer()
    with pytest.raises(ConfigError, match=r"model.text_head=none .* not model.embed_dim"):
        _task(tokenizer, text_head="none")
    with pytest.raises(ConfigError, match=r"pooling=cls but the encoder \(AudioEncoder\) has no"):
        _task(tokenizer, pooling="cls")
    with pytest.raises(ConfigError, match="embed\\(ids, mask\\)"):
        ContrastiveTask(encoder=audio_encoder(), text_encoder=nn.Linear(2, 2), optimizer=ADAMW)
    task = _task(tokenizer)
    with pytest.raises(ConfigError, match=r"data.max_caption_tokens \(64\) exceeds .* 48"):
        task.connect_data(fake_datamodule(max_caption_tokens=64, tokenizer=tokenizer))
    with pytest.raises(UserError, match="another tokenizer"):
        task.connect_data(fake_datamodule(tokenizer=CharTokenizer.train(["xyz"])))
    with pytest.raises(UserError, match=r"has no \{label\}"):
        task.zero_shot_classify(torch.zeros(1, 16), ["a"], template="a sound")
    batch = _batches(tokenizer, [0])[0]
    with pytest.raises(UserError, match=r"holds 1 item"):
        task.training_step(batch, 0)


def test_a_resumed_run_ends_where_an_uninterrupted_run_ends(tmp_path):
    tokenizer = _tokenizer()
    batches = _batches(tokenizer, [0, 5, 2, 7, 4, 1, 6, 3])

    class StopAfter(L.Callback):      # an interruption: same schedule, stopped early
        def on_train_epoch_end(self, trainer, task):
            trainer.should_stop = trainer.current_epoch == 1

    def fit(root, ckpt_path=None, stop=False):
        task = _task(tokenizer)
        trainer = _trainer(max_epochs=4, default_root_dir=root, enable_checkpointing=True,
                           callbacks=[ModelCheckpoint(dirpath=root, save_last=True),
                                      *([StopAfter()] if stop else [])])
        trainer.fit(task, DataLoader(batches, batch_size=None), ckpt_path=ckpt_path,
                    weights_only=True)
        return trainer, task

    ref_trainer, ref = fit(tmp_path / "ref")
    assert fit(tmp_path / "run", stop=True)[0].global_step == 4
    trainer, resumed = fit(tmp_path / "run", ckpt_path=str(tmp_path / "run" / "last.ckpt"))
    assert trainer.global_step == ref_trainer.global_step == 8
    a, b = ref.state_dict(), resumed.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa, sb = (t.optimizers[0].state_dict()["state"] for t in (ref_trainer, trainer))
    for i in sa:
        for k in sa[i]:
            assert torch.equal(torch.as_tensor(sa[i][k]), torch.as_tensor(sb[i][k])), (i, k)


def test_relevance_keys_on_a_built_in_set_are_the_event_sequence():
    task = _task(_tokenizer())
    # No run config (real data): each caption's own item only.
    assert task.relevance_keys(["x"], [["A low beep."]]) is None
    task.run_config = {"data": {"synthetic": {"kind": "audio_captions"}}}
    # Worked by hand from the grammar (mmtf.synthetic.audio.PHRASES / TEMPLATES):
    #   c0, c1: (tone low), (chirp rising) - "low beep" and "deep tone" are both a low tone,
    #           "upward sweep" a rising chirp, "X after Y" reverses: "Y then X";
    #   c2:     the same two events in the other order;
    #   c3:     captions that do not parse: its own id.
    refs = [["A low beep followed by a rising chirp.", "A deep tone, then an upward sweep."],
            ["A rising sweep after a loud low tone."],
            ["A rising chirp followed by a low beep."],
            ["Nothing the grammar says.", "neither does this"]]
    keys = task.relevance_keys(["c0", "c1", "c2", "c3"], refs).tolist()
    assert keys[0] == keys[1]
    assert len({keys[0], keys[2], keys[3]}) == 3
    assert keys[3] == item_keys(["id:c3"]).item()


def test_validation_ranks_clips_of_the_same_group_as_relevant():
    # Items 0 and 1 share a relevance group: each of their captions has two relevant clips.
    tokenizer = _tokenizer()
    task = _task(tokenizer)
    task.relevance_keys = lambda ids, refs: item_keys(["g" if i in ("alpha", "bravo") else i
                                                       for i in ids])
    batches = _batches(tokenizer, [0, 1, 2, 3])
    got = _trainer().validate(task, DataLoader(batches, batch_size=None), verbose=False)[0]
    task.eval()
    with torch.no_grad():
        waves = _waves()[:4]
        media = task.embed_media(waves, torch.full((4,), waves.shape[1]))
        text = task.embed_texts([c for caps in CAPTIONS[:4] for c in caps])
    group = torch.tensor([0, 0, 2, 3])
    relevant = group.repeat_interleave(2)[:, None] == group[None, :]               # (8, 4)
    for name, value in retrieval_metrics(text @ media.T, relevant).items():
        assert got[f"val/text_to_audio/{name}"] == pytest.approx(value, abs=1e-6), name
    # chance with N = 4 clips: 4 captions with R = 2 (E[R@1] 1/2), 4 with R = 1 (1/4)
    assert got["val/text_to_audio/chance/R@1"] == pytest.approx((4 * 1 / 2 + 4 * 1 / 4) / 8)


def test_a_global_batch_of_one_item_is_refused_before_training():
    task = _task(_tokenizer())
    dm = fake_datamodule(tokenizer=task.tokenizer, batch_size=1)
    with pytest.raises(ConfigError, match=r"data.batches.batch_size=1 on 1 rank\(s\): a global "
                                          r"batch of one item has no negative .* >= 2"):
        task.connect_data(dm)
    task.connect_data(fake_datamodule(tokenizer=task.tokenizer, batch_size=2))


def test_the_model_config_names_every_constructor_argument():
    import inspect
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    conf = Path(__file__).resolve().parents[3] / "conf"
    with initialize_config_dir(str(conf), version_base="1.3"):
        cfg = compose("train", overrides=["model=contrastive"])
    expected = set(inspect.signature(ContrastiveTask.__init__).parameters) - {"self"}
    assert set(cfg.model) - {"_target_", "_convert_"} == expected
    assert cfg.model.text_encoder._target_ == "mmtf.encoders.TextEncoder"
    assert cfg.model.text_encoder.vocab_size == cfg.tokenizer.vocab_size     # the run's BPE
