"""Beam search: a hand-built toy decoder whose best sequences are known, width 1 == greedy,
cache == no cache, n-best shapes and ordering."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from mmtf.decoders import EncoderDecoder, TextDecoder
from mmtf.decoders.generation import GenerationConfig, generate
from tests.unit.decoders.conftest import make_model
from tests.unit.decoders.stubs import BOS, EOS, PAD, IdentityEncoder, ToyDecoder, toy_inputs

A, B, C = 4, 5, 6

# Greedy takes A (0.5) then eos (0.35): p = 0.175. The best sequence is B eos: 0.4 * 0.9 = 0.36.
TRAP = {(): {A: 0.5, B: 0.4, C: 0.1},
        (A,): {EOS: 0.35, A: 0.33, B: 0.32},
        (B,): {EOS: 0.9, A: 0.05, C: 0.05}}

# Complete sequences and probabilities: A eos .33, A C eos .27, B eos .04, B A eos .288,
# B A C eos .072. Raw log-prob ranks A eos first; length penalty 1 ranks B A eos first.
LENGTHS = {(): {A: 0.6, B: 0.4},
           (A,): {EOS: 0.55, C: 0.45},
           (B,): {A: 0.9, EOS: 0.1},
           (B, A): {EOS: 0.8, C: 0.2}}


def toy(table) -> EncoderDecoder:
    dec = ToyDecoder(tables={0: table, 1: table}, vocab_size=8, default={EOS: 1.0})
    return EncoderDecoder(encoder=IdentityEncoder(dim=2), decoder=dec)


def exhaustive(table, max_new: int, length_penalty: float) -> list[tuple[list[int], float]]:
    """Every eos-terminated sequence of the table (independent of the beam code), best first."""
    done = []

    def walk(prefix, logp):
        if prefix and prefix[-1] == EOS:
            done.append((prefix, logp / len(prefix) ** length_penalty))
            return
        if len(prefix) == max_new:
            return
        for token, p in table.get(tuple(prefix), {EOS: 1.0}).items():
            walk(prefix + [token], logp + math.log(p))

    walk([], 0.0)
    return sorted(done, key=lambda d: -d[1])


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_finds_the_optimum_greedy_misses(use_cache):
    model = toy(TRAP)
    x = toy_inputs([0, 1])
    greedy = model.generate(x, max_new_tokens=6, use_cache=use_cache)
    assert greedy.tokens.tolist() == [[A, EOS]] * 2
    beam = model.generate(x, strategy="beam", num_beams=2, length_penalty=1.0,
                          num_return_sequences=2, max_new_tokens=6, use_cache=use_cache)
    assert beam.tokens[:, 0].tolist() == [[B, EOS]] * 2               # != greedy
    assert beam.tokens[:, 1].tolist() == [[A, EOS]] * 2
    expected = torch.tensor([math.log(0.4 * 0.9) / 2, math.log(0.5 * 0.35) / 2])
    torch.testing.assert_close(beam.scores, expected.expand(2, -1))
    assert beam.lengths.tolist() == [[2, 2]] * 2
    if use_cache:
        assert model.decoder.steps > 0


@pytest.mark.parametrize(("length_penalty", "expected"), [
    (1.0, [([B, A, EOS], math.log(0.4 * 0.9 * 0.8) / 3),
           ([A, C, EOS], math.log(0.6 * 0.45) / 3),
           ([A, EOS], math.log(0.6 * 0.55) / 2)]),
    (0.0, [([A, EOS], math.log(0.6 * 0.55)),
           ([B, A, EOS], math.log(0.4 * 0.9 * 0.8)),
           ([A, C, EOS], math.log(0.6 * 0.45))]),
])
@pytest.mark.parametrize("use_cache", [True, False])
def test_length_penalty_nbest_scores_by_hand(length_penalty, expected, use_cache):
    model = toy(LENGTHS)
    out = model.generate(toy_inputs([0]), strategy="beam", num_beams=3, num_return_sequences=3,
                         length_penalty=length_penalty, early_stopping=False, max_new_tokens=5,
                         use_cache=use_cache)
    # The hand-written expectation and the brute-force enumeration agree ...
    brute = exhaustive(LENGTHS, 5, length_penalty)[:3]
    assert [s for s, _ in brute] == [s for s, _ in expected]
    for (_, want), (_, got) in zip(expected, brute):
        assert got == pytest.approx(want)
    # ... and so does beam search.
    width = max(len(s) for s, _ in expected)
    assert out.tokens[0].tolist() == [s + [PAD] * (width - len(s)) for s, _ in expected]
    torch.testing.assert_close(out.scores[0], torch.tensor([w for _, w in expected]))
    assert out.lengths[0].tolist() == [len(s) for s, _ in expected]
    assert (out.scores[0].diff() <= 0).all()                          # sorted, best first


def test_early_stopping_true_stops_at_num_beams_finished():
    # k=2: A eos finishes at step 2, B A eos and A C eos at step 3, which fills the k slots and
    # ends the search; the running beam B A C (and B A C eos, p=.072) is never explored further.
    model = toy(LENGTHS)
    out = model.generate(toy_inputs([0]), strategy="beam", num_beams=2, num_return_sequences=2,
                         length_penalty=0.0, early_stopping=True, max_new_tokens=5)
    assert out.tokens[0].tolist() == [[A, EOS, PAD], [B, A, EOS]]


def test_unfinished_beams_are_returned_at_max_new_tokens():
    model = toy(LENGTHS)
    out = model.generate(toy_inputs([0]), strategy="beam", num_beams=2, num_return_sequences=2,
                         length_penalty=0.0, max_new_tokens=1)
    assert out.tokens[0].tolist() == [[A], [B]]                       # no eos: out of steps
    torch.testing.assert_close(out.scores[0], torch.tensor([math.log(0.6), math.log(0.4)]))


@pytest.mark.parametrize("seed", [0, 1])
def test_width_one_equals_greedy(seed, batch):
    model = make_model(seed)
    greedy = model.generate(*batch, max_new_tokens=10)
    beam = model.generate(*batch, strategy="beam", num_beams=1, length_penalty=0.0,
                          max_new_tokens=10)
    assert torch.equal(beam.tokens, greedy.tokens)
    torch.testing.assert_close(beam.scores, greedy.scores)
    beam_lp = model.generate(*batch, strategy="beam", num_beams=1, length_penalty=1.0,
                             max_new_tokens=10)
    assert torch.equal(beam_lp.tokens, greedy.tokens)
    torch.testing.assert_close(beam_lp.scores, greedy.scores / greedy.lengths)


@pytest.mark.parametrize("seed", [0, 1])
def test_cached_beam_equals_uncached(seed, batch):
    model = make_model(seed)
    kw = dict(strategy="beam", num_beams=3, num_return_sequences=3, max_new_tokens=8)
    cached = model.generate(*batch, **kw)
    ref = model.generate(*batch, use_cache=False, **kw)
    assert cached.tokens.shape == (3, 3, 8)
    assert torch.equal(cached.tokens, ref.tokens)
    torch.testing.assert_close(cached.scores, ref.scores, atol=1e-5, rtol=1e-5)
    assert (cached.scores.diff(dim=1) <= 0).all()
    # Beams really diverge and reorder: the n-best rows of an item differ.
    assert len({tuple(r) for r in cached.tokens[0].tolist()}) == 3


# ----------------------------------------------------------------------------- real decoder
# A TextDecoder small enough to enumerate: vocab pad, bos, eos + 3 words, at most 3 new tokens:
# 13 eos-terminated sequences and 27 that run out of steps.
WORDS = (3, 4, 5)


def brute_force_best(decoder: TextDecoder, memory: torch.Tensor, mask: torch.Tensor,
                     max_new: int, length_penalty: float) -> tuple[list[int], float]:
    """Score every complete sequence by teacher forcing (the full forward, not the cache)."""
    seqs = [list(p) + [EOS] for n in range(max_new) for p in itertools.product(WORDS, repeat=n)]
    seqs += [list(p) for p in itertools.product(WORDS, repeat=max_new)]        # out of steps
    targets = torch.tensor([s + [PAD] * (max_new - len(s)) for s in seqs])      # (r, max_new)
    inputs = torch.cat([torch.full((len(seqs), 1), BOS), targets[:, :-1]], 1)   # (r, max_new)
    with torch.no_grad():
        logits = decoder(inputs, memory.expand(len(seqs), -1, -1),
                         mask.expand(len(seqs), -1)).double()                   # (r, max_new, v)
    logits[..., [PAD, BOS]] = -math.inf                                         # never generated
    logp = logits.log_softmax(-1).gather(2, targets[..., None])[..., 0]         # (r, max_new)
    scores = [logp[i, : len(s)].sum().item() / len(s) ** length_penalty
              for i, s in enumerate(seqs)]
    best = max(range(len(seqs)), key=scores.__getitem__)
    return seqs[best], scores[best]


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
@pytest.mark.parametrize("seed", [3, 5, 9])     # seeds where greedy misses a best sequence
def test_beam_search_on_text_decoder_equals_brute_force(seed, length_penalty):
    torch.manual_seed(seed)
    decoder = TextDecoder(vocab_size=6, dim=32, depth=2, num_heads=4, context_dim=16,
                          max_len=8, tie_embeddings=False).eval()
    with torch.no_grad():                        # flat enough that greedy is not optimal
        decoder.embed.weight.normal_(0.0, 1.0)
        decoder.lm_head.weight.normal_(0.0, 0.2)
    memory = torch.randn(2, 5, 16)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    # 9 beams hold every 2-word prefix, so the search is exact for the best sequence.
    config = GenerationConfig(strategy="beam", num_beams=9, max_new_tokens=3,
                              length_penalty=length_penalty, early_stopping=False)
    out = generate(decoder, memory, mask, config, prompt_ids=[BOS], eos_id=EOS, pad_id=PAD)
    greedy = generate(decoder, memory, mask, GenerationConfig(max_new_tokens=3), prompt_ids=[BOS],
                      eos_id=EOS, pad_id=PAD)
    greedy_missed = False
    for i in range(2):
        seq, score = brute_force_best(decoder, memory[i:i + 1], mask[i:i + 1], 3, length_penalty)
        assert out.tokens[i, : out.lengths[i]].tolist() == seq
        assert out.scores[i].item() == pytest.approx(score, abs=1e-5)
        greedy_missed |= greedy.tokens[i, : greedy.lengths[i]].tolist() != seq
    assert greedy_missed                          # the search had something to find
