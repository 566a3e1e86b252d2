"""repetition_penalty and no_repeat_ngram_size: the logits rule against Hugging Face's logits
processors, hand-computed decodes on a table-driven decoder, and no repeated n-gram in output."""

from __future__ import annotations

import math

import pytest
import torch

from mmtf.decoders import EncoderDecoder
from mmtf.decoders.generation import GenerationConfig, generate, penalize_repeats
from mmtf.errors import UserError
from tests.unit.decoders.conftest import IN_DIM, make_model
from tests.unit.decoders.stubs import BOS, EOS, IdentityEncoder, ToyDecoder, toy_inputs

A, B = 4, 5

# Without a penalty greedy goes A, A (0.55), eos. With repetition_penalty=3 the logit of A after
# A is 3 * ln 0.55 = -1.794 against ln 0.45 = -0.799 for eos: eos wins (p = 0.730).
REPEAT = {(): {A: 0.6, B: 0.4},
          (A,): {A: 0.55, EOS: 0.45},
          (A, A): {EOS: 1.0},
          (B,): {EOS: 0.5, A: 0.5},
          (B, A): {EOS: 1.0}}


def toy() -> EncoderDecoder:
    dec = ToyDecoder(tables={0: REPEAT}, vocab_size=8, default={EOS: 1.0})
    return EncoderDecoder(encoder=IdentityEncoder(dim=2), decoder=dec)


def exhaustive_penalized(table, max_new: int, penalty: float) -> list[tuple[list[int], float]]:
    """Every eos-terminated sequence with its log-prob under the CTRL rule, best first: at each
    prefix the logits (log p) of tokens in bos + prefix are scaled, then renormalised."""
    done = []

    def walk(prefix, logp):
        if prefix and prefix[-1] == EOS:
            done.append((prefix, logp))
            return
        if len(prefix) == max_new:
            return
        logits = {tok: math.log(p) for tok, p in table.get(tuple(prefix), {EOS: 1.0}).items()}
        for tok in {BOS, *prefix} & set(logits):
            v = logits[tok]
            logits[tok] = v * penalty if v < 0 else v / penalty
        norm = math.log(sum(math.exp(v) for v in logits.values()))
        for tok, v in logits.items():
            walk(prefix + [tok], logp + v - norm)

    walk([], 0.0)
    return sorted(done, key=lambda d: -d[1])


@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3, 2.5])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
def test_logits_rule_equals_hugging_face_processors(penalty, n):
    logits_process = pytest.importorskip("transformers.generation.logits_process")
    gen = torch.Generator().manual_seed(int(penalty * 10) + n)
    history = torch.randint(0, 6, (5, 9), generator=gen)      # small id range: many repeats
    history[0, -2:] = history[0, :2]                          # a repeated bigram for sure
    logits = torch.randn(5, 12, generator=gen) * 3
    expected = logits.clone()
    if penalty != 1.0:
        expected = logits_process.RepetitionPenaltyLogitsProcessor(penalty)(history, expected)
    if n:
        expected = logits_process.NoRepeatNGramLogitsProcessor(n)(history, expected)
    got = penalize_repeats(logits.clone(), history, repetition_penalty=penalty,
                           no_repeat_ngram_size=n)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if n == 2:
        assert torch.isinf(got[0]).any()                      # the bigram's next token banned


def test_greedy_with_penalty_takes_the_hand_computed_path():
    x = toy_inputs([0])
    plain = toy().generate(x, max_new_tokens=5)
    assert plain.tokens.tolist() == [[A, A, EOS]]
    out = toy().generate(x, max_new_tokens=5, repetition_penalty=3.0)
    assert out.tokens.tolist() == [[A, EOS]]
    # Scores: log-probs of the penalised distribution, ln 0.6 + ln 0.730.
    a_logit, eos_logit = 3 * math.log(0.55), math.log(0.45)
    p_eos = math.exp(eos_logit) / (math.exp(eos_logit) + math.exp(a_logit))
    assert out.scores.item() == pytest.approx(math.log(0.6) + math.log(p_eos), rel=1e-5)


@pytest.mark.parametrize("penalty", [1.0, 3.0, 0.4])
def test_beam_and_top1_sampling_follow_the_penalty(penalty):
    x = toy_inputs([0])
    best, best_score = exhaustive_penalized(REPEAT, 5, penalty)[0]
    # Width 4 keeps every live hypothesis of this table: beam search is exhaustive here.
    beam = toy().generate(x, strategy="beam", num_beams=4, length_penalty=0.0,
                          early_stopping=False, max_new_tokens=5, repetition_penalty=penalty)
    assert beam.tokens[0, : beam.lengths[0]].tolist() == best
    assert beam.scores.item() == pytest.approx(best_score, rel=1e-5)
    greedy = toy().generate(x, max_new_tokens=5, repetition_penalty=penalty)
    sample = toy().generate(x, strategy="sample", top_k=1, max_new_tokens=5,
                            repetition_penalty=penalty)
    assert torch.equal(sample.tokens, greedy.tokens)


@pytest.mark.parametrize("options, n", [(dict(strategy="greedy"), 1), (dict(strategy="greedy"), 2),
                                        (dict(strategy="greedy"), 3),
                                        (dict(strategy="beam", num_beams=3), 2),
                                        (dict(strategy="sample", temperature=0.7), 2)])
def test_no_ngram_repeats_in_generated_rows(options, n):
    model = make_model(0)
    x, lengths = torch.randn(3, 7, IN_DIM), torch.tensor([7, 4, 2])
    common = dict(max_new_tokens=12, min_new_tokens=12, **options)

    def repeats(tokens: torch.Tensor, size: int) -> int:
        count = 0
        for row in tokens.tolist():
            seq = [BOS, *row]
            grams = [tuple(seq[i:i + size]) for i in range(len(seq) - size + 1)]
            count += len(grams) - len(set(grams))
        return count

    gen = torch.Generator().manual_seed(0)
    free = model.generate(x, lengths, generator=gen, **common)
    assert repeats(free.tokens, n) > 0                      # this model does repeat itself
    gen = torch.Generator().manual_seed(0)
    out = model.generate(x, lengths, generator=gen, no_repeat_ngram_size=n, **common)
    assert out.tokens.shape[1] == 12 and repeats(out.tokens, n) == 0


def test_uncached_reference_agrees_with_penalties():
    model, x = make_model(1), torch.randn(2, 5, IN_DIM)
    options = dict(max_new_tokens=10, repetition_penalty=1.4, no_repeat_ngram_size=2)
    cached = model.generate(x, **options)
    uncached = model.generate(x, use_cache=False, **options)
    assert torch.equal(cached.tokens, uncached.tokens)


@pytest.mark.parametrize("key, value, rule", [
    ("repetition_penalty", 0.0, r"repetition_penalty \(0.0\) must be > 0"),
    ("repetition_penalty", -1.2, r"repetition_penalty \(-1.2\) must be > 0"),
    ("no_repeat_ngram_size", -1, r"no_repeat_ngram_size \(-1\) must be an integer >= 0"),
    ("no_repeat_ngram_size", 2.5, r"no_repeat_ngram_size \(2.5\) must be an integer >= 0"),
])
def test_bad_values_name_the_key_and_rule(key, value, rule):
    with pytest.raises(UserError, match=rule):
        GenerationConfig(**{key: value})


def test_the_prompt_counts_as_already_in_the_row():
    """Hugging Face penalises the decoder's input ids, prompt included: so does generate."""
    model = make_model(2)
    memory = torch.randn(2, 5, model.decoder.context_dim)
    prompt = [BOS, 7, 9, 7]
    seen = {}

    def first_step(penalty: float) -> torch.Tensor:
        config = GenerationConfig(max_new_tokens=1, repetition_penalty=penalty)
        generate(model.decoder, memory, None, config, prompt_ids=prompt, eos_id=EOS, pad_id=0,
                 callback=lambda t, tokens, logits: seen.__setitem__(penalty, logits.clone()))
        return seen[penalty]

    free, penalised = first_step(1.0), first_step(2.0)
    for token in (7, 9):
        expected = torch.where(free[:, token] < 0, free[:, token] * 2.0, free[:, token] / 2.0)
        torch.testing.assert_close(penalised[:, token], expected, rtol=0, atol=0)
    others = [i for i in range(free.shape[1]) if i not in (7, 9)]
    torch.testing.assert_close(penalised[:, others], free[:, others], rtol=0, atol=0)
