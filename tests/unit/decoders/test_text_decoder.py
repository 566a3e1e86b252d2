"""TextDecoder: shapes, tied head, memory mask, cached steps == full pass, errors, configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtf.decoders import TextDecoder
from mmtf.errors import UserError
from tests.unit.presets import flat, load_preset

CONF = Path(__file__).resolve().parents[3] / "conf" / "model" / "decoder"
# Builders of imported architectures (mmtf.pretrained.*) are tested with their families.
DECODER_CONFIGS = sorted(p.stem for p in CONF.rglob("*.yaml")
                         if not load_preset("decoder", p.stem)._target_.startswith("mmtf.pretrained."))


def tiny(**kw) -> TextDecoder:
    args = dict(vocab_size=30, dim=32, depth=2, num_heads=4, context_dim=24, max_len=16)
    return flat(TextDecoder, **(args | kw)).eval()


def test_forward_shape_and_tied_head():
    dec = tiny()
    logits = dec(torch.randint(0, 30, (2, 5)), torch.randn(2, 7, 24))
    assert logits.shape == (2, 5, 30)
    assert dec.lm_head.weight is dec.embed.weight
    untied = tiny(tie_embeddings=False)
    assert untied.lm_head.weight is not untied.embed.weight
    assert sum(p.numel() for p in untied.parameters()) == (
        sum(p.numel() for p in dec.parameters()) + 30 * 32)


def test_memory_mask_hides_padded_positions():
    dec = tiny()
    tokens, memory = torch.randint(0, 30, (2, 5)), torch.randn(2, 7, 24)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    ref = dec(tokens, memory, mask)
    changed = memory.clone()
    changed[1, 4:] = torch.randn(3, 24) * 10                  # masked positions of row 1
    torch.testing.assert_close(dec(tokens, changed, mask), ref)
    changed[1, 0] += 1.0                                      # a valid position
    assert not torch.allclose(dec(tokens, changed, mask)[1], ref[1])


@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
def test_cached_steps_equal_full_pass(num_kv_heads):
    dec = tiny(num_kv_heads=num_kv_heads)
    tokens, memory = torch.randint(0, 30, (3, 9)), torch.randn(3, 7, 24)
    mask = torch.tensor([[True] * 7, [True] * 5 + [False] * 2, [True] * 2 + [False] * 5])
    with torch.no_grad():
        full = dec(tokens, memory, mask)
        cache = dec.make_cache(batch_size=3, context_len=7, max_len=9)
        chunks = [dec.step(tokens[:, :4], cache, memory=memory, memory_mask=mask)]  # prefill
        chunks += [dec.step(tokens[:, i:i + 1], cache) for i in range(4, 9)]        # 1 token
    assert cache.length == 9
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cache_reorder_follows_rows_and_keeps_cross_cache():
    dec = tiny()
    tokens, memory = torch.randint(0, 30, (2, 4)), torch.randn(1, 7, 24).expand(2, -1, -1)
    with torch.no_grad():
        cache = dec.make_cache(batch_size=2, context_len=7, max_len=5)
        dec.step(tokens[:, :3], cache, memory=memory)
        cross_before = cache.cross_caches[0].keys.clone()
        cache.reorder(torch.tensor([1, 1]))                  # both rows follow row 1
        out = dec.step(tokens[1:2, 3:4].expand(2, 1), cache)[:, -1]
        ref = dec(tokens[1:2], memory[:1])[:, -1]
    torch.testing.assert_close(out, ref.expand(2, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.cross_caches[0].keys, cross_before)


def test_errors_name_the_key():
    dec = tiny()
    with pytest.raises(UserError, match=r"17 target positions exceed max_len=16"):
        dec(torch.zeros(1, 17, dtype=torch.long), torch.randn(1, 3, 24))
    with pytest.raises(UserError, match=r"context_dim=24\); got shape \(1, 3, 32\)"):
        dec(torch.zeros(1, 2, dtype=torch.long), torch.randn(1, 3, 32))
    with pytest.raises(UserError, match=r"cache max_len \(17\) must be in \[1, "
                                        r"model.decoder.max_len=16\]"):
        dec.make_cache(batch_size=1, context_len=3, max_len=17)
    cache = dec.make_cache(batch_size=1, context_len=3, max_len=2)
    with pytest.raises(ValueError, match=r"first step needs memory="):
        dec.step(torch.zeros(1, 1, dtype=torch.long), cache)
    dec.step(torch.zeros(1, 2, dtype=torch.long), cache, memory=torch.randn(1, 3, 24))
    with pytest.raises(UserError, match=r"2 \+ 1 target positions exceed max_len=2"):
        dec.step(torch.zeros(1, 1, dtype=torch.long), cache)
    with pytest.raises(UserError, match=r"^model\.decoder: Attention: dim \(32\), num_heads \(0\)"):
        tiny(num_heads=0)
    with pytest.raises(UserError, match=r"^model\.decoder: Attention: dim \(32\) must be "
                                        r"divisible by num_heads \(5\); change dim or num_heads\.$"):
        tiny(num_heads=5)
    with pytest.raises(UserError, match=r"^model\.decoder: TransformerStack: dropout \(1\.5\)"):
        tiny(dropout=1.5)
    with pytest.raises(UserError, match=r"pad_id \(30\) must be in \[0, vocab_size=30\)"):
        tiny(pad_id=30)


@pytest.mark.parametrize("name", DECODER_CONFIGS)
def test_decoder_configs_instantiate(name):
    cfg = load_preset("decoder", name)
    with torch.device("meta"):
        dec = instantiate(cfg)
    assert isinstance(dec, TextDecoder)
    assert dec.dim == cfg.dim and dec.depth == cfg.depth and dec.vocab_size == cfg.vocab_size


def test_tiny_config_runs():
    dec = instantiate(OmegaConf.load(CONF / "text_tiny.yaml")).eval()
    assert dec.depth in (1, 2) and dec.dim == 32
    assert dec(torch.randint(0, dec.vocab_size, (2, 4)), torch.randn(2, 3, 32)).shape == (
        2, 4, dec.vocab_size)
