"""mmtf's own TextEncoder (from scratch, mmtf's BPE tokenizer): its configs, pooling against
hand-worked values, padding invariance, the projection head, batching of embed_text, gradients
and an mmtf export round trip. The BERT-family import is tested in tests/unit/pretrained/."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from mmtf.encoders import TextEmbedder, TextEncoder, pool
from mmtf.encoders.text import PoolingOptions, encode_texts
from mmtf.errors import UserError
from mmtf.hub import write_export
from mmtf.nn import BlockOptions, EmbeddingOptions
from mmtf.text import BPETokenizer
from tests.unit.presets import load_preset

CONF = Path(__file__).resolve().parents[3] / "conf" / "model" / "text_encoder"
OWN = sorted(p.stem for p in CONF.glob("*.yaml")
             if load_preset("text_encoder", p.stem)._target_ == "mmtf.encoders.TextEncoder")
CORPUS = ["a dog barks at the cat", "rain falls on a tin roof", "birds sing in tall trees",
          "people talk near the busy road"] * 3


def tiny(**kw) -> TextEncoder:
    torch.manual_seed(0)
    return TextEncoder(**{"vocab_size": 40, "dim": 16, "depth": 2, "num_heads": 2, **kw}).eval()


def test_the_presets_exist_and_list_every_key():
    assert {"text_tiny", "text_small"} <= set(OWN)
    parts = {"block": BlockOptions, "embedding": EmbeddingOptions, "pooling": PoolingOptions}
    for name in OWN:
        cfg = load_preset("text_encoder", name)
        expected = set(inspect.signature(TextEncoder.__init__).parameters) - {"self"}
        assert set(cfg.keys()) - {"_target_"} == expected, name
        for key, cls in parts.items():
            assert set(cfg[key]) - {"_target_"} == {f.name for f in fields(cls)}, (name, key)


@pytest.mark.parametrize("name", OWN)
def test_presets_build_and_embed(name):
    cfg = load_preset("text_encoder", name)
    enc = instantiate(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 7))
    out = enc(ids, torch.tensor([7, 4]))
    assert out.memory.shape == (2, 7, cfg.dim) and out.mask.sum().item() == 11
    assert enc.embed(ids).shape == (2, cfg.dim)


def test_pool_modes_hand_worked():
    """memory[b, s] = 10 b + s (one channel); row 0 right-padded (3 real), row 1 left-padded
    (real at 2..4): mean = (0+1+2)/3 = 1 and (12+13+14)/3 = 13; cls = the first real token: 0,
    12; last = the last real one: 2, 14."""
    memory = torch.tensor([[0., 1, 2, 3, 4], [10, 11, 12, 13, 14]])[..., None]
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=torch.bool)
    assert pool(memory, mask, "mean").flatten().tolist() == [1.0, 13.0]
    assert pool(memory, mask, "cls").flatten().tolist() == [0.0, 12.0]
    assert pool(memory, mask, "last").flatten().tolist() == [2.0, 14.0]
    assert pool(memory, None, "last").flatten().tolist() == [4.0, 14.0]


@pytest.mark.parametrize("kw", [dict(), dict(positions="learned", max_len=12),
                                dict(causal=True, pooling={"mode": "last"}),
                                dict(positions="learned", max_len=12,
                                     embedding={"position_offset": 2, "positions_from_mask": True},
                                     block={"postnorm": True}, final_norm=False)])
def test_padding_does_not_change_the_real_tokens(kw):
    """A batch padded on the right gives each text's states and embedding as it has alone."""
    enc = tiny(**kw)
    ids = torch.randint(1, 40, (3, 8))
    lengths = torch.tensor([8, 5, 2])
    out = enc(ids, lengths)
    embedded = enc.embed(ids, lengths)
    for i, n in enumerate(lengths.tolist()):
        alone = enc(ids[i:i + 1, :n])
        torch.testing.assert_close(out.memory[i, :n], alone.memory[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(embedded[i], enc.embed(ids[i:i + 1, :n])[0], atol=1e-5,
                                   rtol=1e-5)
        assert not out.memory[i, n:].any()


def test_mask_forms_agree():
    enc = tiny()
    ids = torch.randint(0, 40, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    by_lengths, by_bool, by_int = (enc(ids, m).memory for m in
                                   (torch.tensor([4, 2]), mask.bool(), mask))
    assert torch.equal(by_lengths, by_bool) and torch.equal(by_bool, by_int)


def test_heads_and_normalisation():
    ids = torch.randint(0, 40, (3, 6))
    linear = tiny(pooling={"head": "linear", "embed_dim": 8})
    pooled = pool(linear(ids).memory, None, "mean")
    torch.testing.assert_close(linear.embed(ids), pooled @ linear.head.weight.T)
    mlp = tiny(pooling={"head": "mlp", "embed_dim": 8, "head_hidden": 24, "normalize": True})
    out = mlp.embed(ids)
    assert out.shape == (3, 8) and mlp.embed_dim == 8
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(3))
    assert not torch.allclose(mlp.embed(ids, normalize=False).norm(dim=-1), torch.ones(3))


@pytest.mark.parametrize(("kw", "match"), [
    (dict(pooling={"embed_dim": 8}), r"embed_dim \(8\) differs from dim \(16\) but "
                                     r"pooling.head is none"),
    (dict(pooling={"head": "linear"}), r"head linear needs pooling.embed_dim"),
    (dict(pooling={"mode": "max"}), r"mode \('max'\) must be one of mean, cls, last"),
    (dict(positions="alibi"), r"positions \('alibi'\) must be 'rope' or 'learned'"),
    (dict(embedding={"position_offset": 2}), r"position_offset \(2\) offsets a learned table"),
    (dict(num_heads=3), r"model.text_encoder: Attention: dim \(16\) must be divisible"),
])
def test_bad_settings_are_one_line_user_errors(kw, match):
    with pytest.raises(UserError, match=match):
        tiny(**kw)


def test_learned_positions_refuse_texts_past_the_table():
    enc = tiny(positions="learned", max_len=6)
    assert enc.max_tokens == 6
    with pytest.raises(UserError, match=r"7 tokens exceed the 6 positions"):
        enc(torch.zeros(1, 7, dtype=torch.long))


def test_bpe_texts_are_wrapped_padded_and_cut_keeping_eos():
    tok = BPETokenizer.train(CORPUS, vocab_size=60)
    body = tok.encode("a dog barks at the cat", add_special=False)
    assert len(body) > 3
    ids, mask = encode_texts(tok, ["a dog barks at the cat", "rain"], max_len=5)
    # [bos, first three body ids, eos]; "rain" is shorter and padded with pad_id (0)
    assert ids[0].tolist() == [tok.bos_id, *body[:3], tok.eos_id]
    rain = tok.encode("rain")
    assert ids[1].tolist() == rain + [tok.pad_id] * (5 - len(rain))
    assert mask.sum(1).tolist() == [5, len(rain)]


def test_embed_text_is_independent_of_batching_and_order():
    tok = BPETokenizer.train(CORPUS, vocab_size=60)
    enc = tiny(vocab_size=tok.vocab_size, pooling={"normalize": True})
    model = TextEmbedder(enc, tok, max_len=8)
    texts = ["rain", "a dog barks at the cat near the busy road", "birds sing", "people"]
    together = model.embed_text(texts, batch_size=3)
    alone = torch.cat([model.embed_text([t]) for t in texts])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    assert model.embed_text([]).shape == (0, 16)
    with pytest.raises(UserError, match=r"item 1 is a int, not a string"):
        model.embed_text(["rain", 3])


def test_every_parameter_gets_a_gradient():
    enc = tiny(positions="learned", max_len=10, block={"dropout": 0.1},
               embedding={"type_vocab_size": 2, "embed_norm": True},
               pooling={"head": "mlp", "embed_dim": 4}).train()
    ids = torch.randint(0, 40, (3, 6))
    enc.embed(ids, torch.tensor([6, 3, 1]), token_type_ids=torch.randint(0, 2, (3, 6))
              ).pow(2).sum().backward()
    missing = [n for n, p in enc.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing


def test_export_round_trip(tmp_path):
    """An export loads back (the parts' keys compared flat); the pooling mode may change, a
    setting that changes the model may not."""
    cfg = load_preset("text_encoder", "text_tiny")
    torch.manual_seed(0)
    enc = instantiate(cfg)
    write_export(tmp_path, enc.state_dict(), cfg)
    build = instantiate(cfg, _partial_=True, pretrained=str(tmp_path))   # parts built
    back = build().eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 5))
    assert torch.equal(back.embed(ids), enc.eval().embed(ids))
    assert build(pooling={"mode": "cls"}).pooling.mode == "cls"
    with pytest.raises(UserError, match=r"config rope_base=500.0 but the export has "
                                        r"rope_base=10000.0"):
        build(rope_base=500.0)
