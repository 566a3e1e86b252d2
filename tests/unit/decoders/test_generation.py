"""Greedy and sampling generation: cache == no cache, per-row stopping, sampling filters, the
static cache (allocated once, cross K/V projected once, one position per step), options."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from omegaconf import OmegaConf

from mmtf.decoders import EncoderDecoder, GenerationConfig
from mmtf.decoders.generation import filter_logits, sample_next
from mmtf.errors import UserError
from mmtf.nn import KVCache
from tests.unit.decoders.conftest import IN_DIM, make_model
from tests.unit.decoders.stubs import EOS, PAD, IdentityEncoder, ToyDecoder, toy_inputs

A, B, C = 4, 5, 6


def logits_log(model, **options):
    """Run generate and record (tokens, logits) of every step through the callback."""
    steps = []
    out = model.generate(*options.pop("inputs"), callback=lambda t, tok, lg: steps.append(
        (tok.clone(), lg.clone())), **options)
    return out, steps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_greedy_equals_uncached(seed):
    model = make_model(seed)
    x, lengths = torch.randn(3, 7, IN_DIM), torch.tensor([7, 5, 2])
    cached, c_steps = logits_log(model, inputs=(x, lengths), max_new_tokens=12)
    ref, r_steps = logits_log(model, inputs=(x, lengths), max_new_tokens=12, use_cache=False)
    assert torch.equal(cached.tokens, ref.tokens)
    assert len(c_steps) == len(r_steps) == cached.tokens.shape[1]
    for (ct, cl), (rt, rl) in zip(c_steps, r_steps):
        assert torch.equal(ct, rt)
        torch.testing.assert_close(cl, rl, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cached.scores, ref.scores, atol=1e-5, rtol=1e-5)


def test_greedy_scores_are_logprob_sums(batch):
    model = make_model()
    out = model.generate(*batch, max_new_tokens=6)
    memory, mask = model.encode(*batch)
    prefix = torch.cat([torch.ones(3, 1, dtype=torch.long), out.tokens[:, :-1]], dim=1)
    with torch.no_grad():
        logits = model.decoder(prefix, memory, mask).double()
    logits[..., [PAD, 1]] = -math.inf                         # pad and bos are never generated
    picked = logits.log_softmax(-1).gather(-1, out.tokens[..., None]).squeeze(-1)
    assert torch.equal(out.tokens, logits.argmax(-1))
    torch.testing.assert_close(out.scores.double(), picked.sum(1), atol=1e-5, rtol=1e-5)


def test_batched_rows_equal_rows_alone():
    model = make_model()
    x, lengths = torch.randn(3, 7, IN_DIM), torch.tensor([7, 4, 2])
    batched = model.generate(x, lengths, max_new_tokens=8)
    for i, n in enumerate(lengths.tolist()):
        alone = model.generate(x[i:i + 1, :n], None, max_new_tokens=8)
        assert torch.equal(batched.tokens[i, : alone.tokens.shape[1]], alone.tokens[0])


def toy_model(tables, default) -> EncoderDecoder:
    dec = ToyDecoder(tables=tables, vocab_size=8, default=default)
    return EncoderDecoder(encoder=IdentityEncoder(dim=2), decoder=dec)


def test_eos_stops_each_row_independently():
    # Kind 0 says "A eos", kind 1 says "A B C A eos"; deterministic tables.
    tables = {0: {(): {A: 1.0}, (A,): {EOS: 1.0}},
              1: {(): {A: 1.0}, (A,): {B: 1.0}, (A, B): {C: 1.0}, (A, B, C): {A: 1.0},
                  (A, B, C, A): {EOS: 1.0}}}
    model = toy_model(tables, default={C: 1.0})
    for use_cache in (True, False):
        out = model.generate(toy_inputs([0, 1, 0]), max_new_tokens=10, use_cache=use_cache)
        assert out.tokens.tolist() == [[A, EOS, PAD, PAD, PAD], [A, B, C, A, EOS],
                                       [A, EOS, PAD, PAD, PAD]]
        assert out.lengths.tolist() == [2, 5, 2]
        assert out.scores.tolist() == [0.0, 0.0, 0.0]
    # Without eos the loop stops at max_new_tokens.
    out = model.generate(toy_inputs([1]), max_new_tokens=3)
    assert out.tokens.tolist() == [[A, B, C]] and out.lengths.tolist() == [3]


def test_min_new_tokens_masks_eos():
    model = toy_model({0: {}}, default={EOS: 0.9, A: 0.1})
    assert model.generate(toy_inputs([0]), max_new_tokens=5).tokens.tolist() == [[EOS]]
    out = model.generate(toy_inputs([0]), max_new_tokens=5, min_new_tokens=3)
    assert out.tokens.tolist() == [[A, A, A, EOS]]
    # The score is the log-prob after masking: A is certain while eos is masked.
    assert out.scores.item() == pytest.approx(math.log(0.9))
    out = model.generate(toy_inputs([0]), max_new_tokens=5, min_new_tokens=5)
    assert out.tokens.tolist() == [[A] * 5]


def test_sampling_is_reproducible_and_top_k1_is_greedy(batch):
    model = make_model()
    kw = dict(strategy="sample", max_new_tokens=10)
    first = model.generate(*batch, generator=torch.Generator().manual_seed(5), **kw)
    other = model.generate(*batch, generator=torch.Generator().manual_seed(6), **kw)
    assert not torch.equal(first.tokens, other.tokens)
    # The same seed through the other code path (whole prefix each step) draws the same tokens.
    uncached = model.generate(*batch, generator=torch.Generator().manual_seed(5),
                              use_cache=False, **kw)
    assert torch.equal(first.tokens, uncached.tokens)
    torch.testing.assert_close(first.scores, uncached.scores, atol=1e-5, rtol=1e-5)
    greedy = model.generate(*batch, max_new_tokens=10)
    for filt in (dict(top_k=1), dict(top_p=1e-6), dict(top_k=1, temperature=3.0)):
        sampled = model.generate(*batch, generator=torch.Generator().manual_seed(0), **kw, **filt)
        assert torch.equal(sampled.tokens, greedy.tokens), filt
        torch.testing.assert_close(sampled.scores, greedy.scores)


def test_sampling_several_sequences_per_input(batch):
    model = make_model()
    out = model.generate(*batch, strategy="sample", num_return_sequences=4, max_new_tokens=6,
                         generator=torch.Generator().manual_seed(0))
    assert out.tokens.shape == (3, 4, 6) and out.scores.shape == (3, 4)
    assert len({tuple(s) for s in out.tokens[0].tolist()}) > 1   # independent draws


def test_filter_logits_by_hand():
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])          # sorted: 0.5, 0.3, 0.15, 0.05
    logits = probs.log()
    kept = lambda out: (out > -math.inf).squeeze(0).tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_p=0.8)) == [False, True, False, True]
    assert kept(filter_logits(logits, top_p=0.81)) == [True, True, False, True]
    assert kept(filter_logits(logits, top_p=0.1)) == [False, True, False, False]
    assert kept(filter_logits(logits, top_k=3)) == [True, True, False, True]
    assert kept(filter_logits(logits, top_k=3, top_p=0.7)) == [False, True, False, True]
    assert kept(filter_logits(logits)) == [True] * 4


def test_sample_frequencies_follow_temperature():
    logits = torch.tensor([[1.0, 0.0, -1.0, 0.5]]).expand(20000, -1)
    gen = torch.Generator().manual_seed(0)
    for temperature in (0.5, 2.0):
        draws = sample_next(logits, temperature=temperature, generator=gen)
        freq = torch.bincount(draws, minlength=4).float() / draws.numel()
        expected = (logits[0] / temperature).softmax(-1)
        torch.testing.assert_close(freq, expected, atol=0.015, rtol=0)
    draws = sample_next(logits, top_k=2, generator=gen)
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    top2 = math.exp(1.0) + math.exp(0.5)                     # only tokens 0 and 3 survive
    expected = torch.tensor([math.exp(1.0) / top2, 0.0, 0.0, math.exp(0.5) / top2])
    torch.testing.assert_close(freq, expected, atol=0.015, rtol=0)


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_static_cache_allocated_once_cross_kv_projected_once(batch, monkeypatch, strategy):
    model = make_model()
    depth = model.decoder.depth
    built = []
    init = KVCache.__init__

    def counting_init(self, **kw):
        built.append(kw["max_len"])
        init(self, **kw)

    monkeypatch.setattr(KVCache, "__init__", counting_init)
    cross_projections, step_widths, caches = [], [], []
    for block in model.decoder.stack.blocks:
        block.cross_attn.to_kv.register_forward_hook(
            lambda mod, inp, out: cross_projections.append(inp[0].shape))
    make_cache, step = model.decoder.make_cache, model.decoder.step
    monkeypatch.setattr(model.decoder, "make_cache",
                        lambda **kw: caches.append(make_cache(**kw)) or caches[-1])
    monkeypatch.setattr(model.decoder, "step",
                        lambda tokens, cache, **kw: step_widths.append(tokens.shape[1])
                        or step(tokens, cache, **kw))
    pointers = []
    record = lambda t, tok, lg: pointers.append(  # noqa: E731
        [c.k.data_ptr() for c in caches[-1].self_caches + caches[-1].cross_caches])
    encoder_calls = model.encoder.calls
    for max_new in (3, 9):
        built.clear(), cross_projections.clear(), step_widths.clear(), pointers.clear()
        model.generate(*batch, strategy=strategy, num_beams=3, max_new_tokens=max_new,
                       min_new_tokens=max_new, callback=record)
        assert built == [max_new] * depth + [7] * depth            # self caches, cross caches
        assert len(cross_projections) == depth                     # once per layer, not per step
        assert step_widths == [1] * max_new                         # one position per token
        assert all(p == pointers[0] for p in pointers)              # written in place
    assert model.encoder.calls == encoder_calls + 2                 # encoded once per call


def test_generation_config_from_yaml_and_errors(batch):
    model = make_model()
    node = OmegaConf.create({"strategy": "beam", "max_new_tokens": 5, "num_beams": 2,
                             "length_penalty": 0.5, "num_return_sequences": 2})
    cfg = GenerationConfig(**node)
    from_cfg = model.generate(*batch, config=cfg)
    from_kwargs = model.generate(*batch, **dataclasses.asdict(cfg))
    assert from_cfg.tokens.shape[:2] == (3, 2)
    assert torch.equal(from_cfg.tokens, from_kwargs.tokens)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['beams'\]"):
        model.generate(*batch, beams=2)
    with pytest.raises(UserError, match=r"the prompt \(1 tokens\) \+ max_new_tokens \(33\) - 1 > "
                                        r"model.decoder.max_len \(32\)"):
        model.generate(*batch, max_new_tokens=33)


@pytest.mark.parametrize(("options", "match"), [
    (dict(strategy="nucleus"), r"strategy \('nucleus'\) must be"),
    (dict(max_new_tokens=0), r"max_new_tokens \(0\) must be >= 1"),
    (dict(min_new_tokens=40), r"min_new_tokens \(40\) must be in \[0, max_new_tokens=32\]"),
    (dict(strategy="beam", num_beams=2, num_return_sequences=3),
     r"num_return_sequences \(3\) > num_beams \(2\)"),
    (dict(num_return_sequences=2), r"strategy 'greedy', which has one answer"),
    (dict(temperature=0.0), r"temperature \(0.0\) must be > 0"),
    (dict(top_k=-1), r"top_k \(-1\) must be >= 0"),
    (dict(top_p=0.0), r"top_p \(0.0\) must be in \(0, 1\]"),
])
def test_generation_config_validation(options, match):
    with pytest.raises(UserError, match=match):
        GenerationConfig(**options)

