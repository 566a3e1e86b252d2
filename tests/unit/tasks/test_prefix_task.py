"""The prefix-model task: frozen parts bit-identical after optimizer steps (encoder and LLM
frozen; LoRA on the LLM), per-part learning rates, a few Lightning steps on CPU that lower the
loss, and the model config composed and built by name."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch.utils.data import DataLoader

from mmtf.errors import ConfigError, UserError
from mmtf.nn.projectors import PROJECTORS, ConcatProjector, build_projector
from mmtf.pretrained.llm import llm_decoder
from mmtf.tasks import PrefixLMTask
from mmtf.tasks.optim import build_optimizer

from .conftest import ADAMW, audio_encoder

VOCAB, MEDIA, EOS, PAD, ASSISTANT = 40, 39, 2, 0, 9
CONF = Path(__file__).resolve().parents[3] / "conf"


def llm(seed: int = 0):
    torch.manual_seed(seed)
    return llm_decoder(vocab_size=VOCAB, dim=32, depth=2, num_heads=4, num_kv_heads=2,
                       mlp_hidden=48, max_len=64, eos_id=EOS, pad_id=PAD)


def task(*, freeze_encoder: bool = False, **kw) -> PrefixLMTask:
    encoder = audio_encoder(freeze=freeze_encoder)
    return PrefixLMTask(**{"encoder": encoder, "decoder": llm(), "optimizer": ADAMW,
                           "projector": {"kind": "concat", "k": 2}, "media_token_id": MEDIA,
                           **kw})


def batch(seed: int = 0, b: int = 3) -> dict[str, torch.Tensor]:
    """Audio of 0.1-0.2 s and right-padded chat items [sys, <audio>, 9, answer .., eos] whose
    answers repeat the item's first answer token (learnable from the text alone)."""
    g = torch.Generator().manual_seed(seed)
    samples = torch.tensor([3200, 1600, 2400][:b])
    media_mask = torch.arange(3200)[None] < samples[:, None]
    media = torch.randn(b, 3200, generator=g) * media_mask
    texts = []
    for i in range(b):
        token = int(torch.randint(10, 20, (1,), generator=g))
        texts.append([5, MEDIA, ASSISTANT, *[token] * (2 + i), EOS])
    width = max(map(len, texts))
    ids = torch.full((b, width), PAD)
    mask = torch.zeros(b, width, dtype=torch.long)
    labels = torch.full((b, width), -100)
    for i, t in enumerate(texts):
        ids[i, :len(t)], mask[i, :len(t)] = torch.tensor(t), 1
        labels[i, 3:len(t)] = torch.tensor(t[3:])                       # the answer only
    return {"media": media, "media_mask": media_mask, "input_ids": ids, "attention_mask": mask,
            "labels": labels}


def steps(model: PrefixLMTask, n: int = 3) -> None:
    opt = build_optimizer(ADAMW, [model.model], 0.05, parts=model.optim_parts())
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters() if p.requires_grad}
    model.train()
    for seed in range(n):
        opt.zero_grad()
        model(batch(seed)).loss.backward()
        opt.step()


def snapshot(model: PrefixLMTask) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_frozen_encoder_and_llm_stay_bit_identical_while_the_projector_trains():
    model = task(freeze_encoder=True, finetuning={"freeze_decoder": True})
    assert {n.split(".")[1] for n, p in model.named_parameters() if p.requires_grad} == {
        "projector"}
    before = snapshot(model)
    steps(model)
    assert not model.model.decoder.training and not model.model.encoder.training
    after = model.state_dict()
    for key, value in before.items():
        moved = not torch.equal(after[key], value)
        assert moved == key.startswith("model.projector."), key


def test_with_lora_on_the_llm_only_adapters_and_projector_change():
    lora = {"r": 2, "alpha": 4, "dropout": 0.0, "parts": ["decoder"],
            "targets": ["q", "k", "v", "o", "mlp"]}
    model = task(freeze_encoder=True, lora=lora)
    before = snapshot(model)
    assert any(".lora_B." in k for k in before)
    steps(model)
    after = model.state_dict()
    for key, value in before.items():
        trains = key.startswith("model.projector.") or (
            key.startswith("model.decoder.") and ".lora_" in key)
        moved = not torch.equal(after[key], value)
        # lora_A may stay put in the first step (B = 0 gives it no gradient), B always moves
        assert moved == trains or ".lora_A." in key, key
    assert all(not torch.equal(after[k], v) for k, v in before.items() if ".lora_B." in k)


def test_per_part_learning_rates():
    model = task(finetuning={"projector_lr_scale": 10.0, "decoder_lr_scale": 0.1})
    opt = build_optimizer(ADAMW, [model.model], 0.05, parts=model.optim_parts())
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    for prefix, lr in (("encoder", 1e-2), ("projector", 1e-1), ("decoder", 1e-3)):
        params = list(getattr(model.model, prefix).parameters())
        assert params and all(lr_of[id(p)] == pytest.approx(lr) for p in params), prefix


def test_a_few_lightning_steps_lower_the_loss():
    model = task()
    batches = [batch(seed) for seed in range(4)]

    def loss() -> float:
        model.eval()
        with torch.no_grad():
            return sum(float(model(b).loss) for b in batches) / len(batches)

    start = loss()
    model.train()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=24, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    model.hparams.warmup_steps = 2
    trainer.fit(model, train_dataloaders=DataLoader(batches, batch_size=None),
                val_dataloaders=DataLoader(batches[:1], batch_size=None))
    end = loss()
    assert end < 0.7 * start, (start, end)
    assert "val/loss" in trainer.callback_metrics
    out = model.generate(batches[0] | {"input_ids": batches[0]["input_ids"][:, :3],
                                       "attention_mask": batches[0]["attention_mask"][:, :3]},
                         max_new_tokens=3)
    assert out.tokens.shape[0] == 3


def test_config_composes_and_builds_the_projector_by_name():
    with initialize_config_dir(str(CONF / "model"), version_base="1.3"):
        cfg = compose(config_name="prefix_lm", overrides=[
            "encoder=audio_tiny", "projector=concat", "projector.k=3",
            "decoder.pretrained=null", f"decoder.vocab_size={VOCAB}", "decoder.dim=32",
            "decoder.depth=1", "decoder.num_heads=4", "decoder.max_len=64",
            f"decoder.eos_id={EOS}", f"media_token_id={MEDIA}"])
    built = instantiate(cfg)
    projector = built.model.projector
    assert isinstance(projector, ConcatProjector) and projector.k == 3
    assert (projector.in_dim, projector.out_dim) == (32, 32)
    assert built.part_frozen("decoder")                  # the config's recipe: LLM frozen
    # Every kind's preset builds with its defaults.
    for kind in ("linear", "mlp", "conv", "qformer", "pixel_shuffle"):
        with initialize_config_dir(str(CONF / "model" / "projector"), version_base="1.3"):
            spec = dict(compose(config_name=kind))
        assert type(build_projector(spec, in_dim=32, out_dim=32)) is PROJECTORS[kind]


def test_bad_settings_are_one_line():
    with pytest.raises(ConfigError, match="model.finetuning.layer_decay is not a fine-tuning"):
        task(finetuning={"layer_decay": 0.5})
    with pytest.raises(UserError, match=r"model.projector.kind \('pool'\) must be one of"):
        task(projector={"kind": "pool"})
    with pytest.raises(ConfigError, match="the batch has no 'labels'"):
        task()({k: v for k, v in batch().items() if k != "labels"})


def test_build_task_rebuilds_from_a_stored_config(tmp_path):
    """The stored config + weights rebuild the same model (what evaluate / resume do)."""
    from mmtf.tasks import build_task

    model = task(grow_vocab=True, media_token_id=VOCAB)      # the placeholder past the vocab
    assert model.model.decoder.vocab_size == VOCAB + 1
    cfg = {"model": {"_target_": "mmtf.tasks.PrefixLMTask",
                     "encoder": {"_target_": "mmtf.encoders.AudioEncoder", "dim": 32, "depth": 1,
                                 "num_heads": 4, "max_seconds": 30.0,
                                 "frontend": {"n_mels": 16}},
                     "decoder": {"_target_": "mmtf.pretrained.llm.llm_decoder",
                                 "vocab_size": VOCAB + 1, "dim": 32, "depth": 2, "num_heads": 4,
                                 "num_kv_heads": 2, "mlp_hidden": 48, "max_len": 64,
                                 "eos_id": EOS, "pad_id": PAD},
                     "projector": {"kind": "concat", "k": 2}, "media_token_id": VOCAB,
                     "grow_vocab": True,
                     "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True}}}
    checkpoint = {"state_dict": model.state_dict(), "mmtf": {"config": cfg, "tokenizer": None}}
    rebuilt, _ = build_task(checkpoint, tmp_path / "x.ckpt")
    assert rebuilt.model.decoder.vocab_size == VOCAB + 1            # grown once, not twice
    b = batch() | {"input_ids": batch()["input_ids"].masked_fill(batch()["input_ids"] == MEDIA,
                                                                 VOCAB)}
    model.eval(), rebuilt.eval()
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(b).logits, model(b).logits)

