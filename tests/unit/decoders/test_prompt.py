"""Decoder prompts longer than bos and special ids that coincide (pad == eos, bos == eos):
the loss against a float64 cross-entropy written by hand, generation against reference loops
on the uncached decoder."""

from __future__ import annotations

import math

import pytest
import torch

from mmtf.decoders import EncoderDecoder, TextDecoder
from mmtf.decoders.generation import GenerationConfig, generate
from tests.unit.decoders.conftest import DIM, IN_DIM, VOCAB
from tests.unit.decoders.stubs import StubEncoder
from tests.unit.presets import flat

PROMPT = [30, 31, 5, 32]          # a 4-token prompt, as Whisper's sot / lang / task / notimestamps
EOS = 7                           # pad == eos, as in Whisper and GPT-2


def make(seed: int = 0, *, pad: int = EOS, eos: int = EOS, prompt=PROMPT) -> EncoderDecoder:
    torch.manual_seed(seed)
    enc = StubEncoder(in_dim=IN_DIM, dim=DIM)
    dec = flat(TextDecoder, vocab_size=VOCAB, dim=DIM, depth=2, num_heads=4, context_dim=DIM,
                      max_len=24, pad_id=pad, positions="learned", bias="qvo")
    with torch.no_grad():
        dec.embed.weight.normal_(0.0, 0.5)
    return EncoderDecoder(encoder=enc, decoder=dec, eos_id=eos, prompt_ids=prompt).eval()


def reference_loss(logits: torch.Tensor, tokens: torch.Tensor, n_prompt: int) -> torch.Tensor:
    """Mean -log p over each row's targets after the prompt up to and including its first eos."""
    logp = logits.double().log_softmax(-1)
    total, count = 0.0, 0
    for b in range(tokens.shape[0]):
        for i in range(n_prompt, tokens.shape[1]):          # i: position of the target token
            total += -logp[b, i - 1, tokens[b, i]]
            count += 1
            if tokens[b, i] == EOS:
                break
    return total / count


def test_loss_scores_the_eos_when_pad_is_eos_and_never_the_prompt():
    model = make()
    x, lengths = torch.randn(3, 6, IN_DIM), torch.tensor([6, 4, 2])
    tokens = torch.tensor([[*PROMPT, 9, 10, 11, EOS, EOS, EOS],
                           [*PROMPT, 12, EOS, EOS, EOS, EOS, EOS],
                           [*PROMPT, 13, 14, 15, 16, 17, EOS]])
    out = model(x, lengths, tokens)
    memory, mask = model.encode(x, lengths)
    logits = model.decoder(tokens[:, :-1], memory, mask)
    # The loss is float32: its rounding (which depends on the CPU's kernels) is ~1e-7 of 12.
    torch.testing.assert_close(out.loss.double(), reference_loss(logits, tokens, len(PROMPT)),
                               rtol=1e-6, atol=1e-6)
    # Control: a loss that ignored every pad id would drop the eos targets, a different value.
    wrong = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(),
                                              ignore_index=EOS)
    assert not torch.allclose(out.loss, wrong)
    # Prompt targets are not scored: changing the prompt's ids changes the logits, not which
    # targets count, and an eos inside the prompt does not end the caption.
    odd = make(prompt=[30, EOS, 5, 32])
    tokens2 = tokens.clone()
    tokens2[:, 1] = EOS
    out2 = odd(x, lengths, tokens2)
    logits2 = odd.decoder(tokens2[:, :-1], *odd.encode(x, lengths))
    torch.testing.assert_close(out2.loss.double(), reference_loss(logits2, tokens2, len(PROMPT)),
                               rtol=1e-6, atol=1e-6)


@torch.no_grad()
def greedy_reference(model: EncoderDecoder, x, lengths, steps: int) -> list[list[int]]:
    """Greedy decoding by full forward passes over prompt + prefix, one row at a time."""
    memory, mask = model.encode(x, lengths)
    banned = ({model.pad_id, *model.prompt_ids} - {model.eos_id})
    rows = []
    for b in range(x.shape[0]):
        seq: list[int] = []
        for _ in range(steps):
            prefix = torch.tensor([[*model.prompt_ids, *seq]])
            logits = model.decoder(prefix, memory[b:b + 1], mask[b:b + 1])[0, -1].double()
            logits[list(banned)] = -math.inf
            seq.append(int(logits.argmax()))
            if seq[-1] == model.eos_id:
                break
        rows.append(seq)
    return rows


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_with_a_prompt_equals_a_reference_loop(use_cache):
    model = make(seed=1)
    x, lengths = torch.randn(3, 6, IN_DIM), torch.tensor([6, 4, 2])
    out = model.generate(x, lengths, strategy="greedy", max_new_tokens=8, use_cache=use_cache)
    expected = greedy_reference(model, x, lengths, 8)
    for row, seq in zip(out.tokens.tolist(), expected):
        assert row[:len(seq)] == seq
        assert all(t == model.pad_id for t in row[len(seq):])


@torch.no_grad()
def test_beam_with_a_prompt_cached_equals_uncached_and_scores_are_prompt_conditioned():
    model = make(seed=2)
    x, lengths = torch.randn(2, 6, IN_DIM), torch.tensor([6, 3])
    options = dict(strategy="beam", num_beams=3, num_return_sequences=3, max_new_tokens=6,
                   length_penalty=1.0)
    cached = model.generate(x, lengths, **options)
    uncached = model.generate(x, lengths, use_cache=False, **options)
    assert torch.equal(cached.tokens, uncached.tokens)
    torch.testing.assert_close(cached.scores, uncached.scores)
    memory, mask = model.encode(x, lengths)
    for b in range(2):
        for n in range(3):
            seq = cached.tokens[b, n, :int(cached.lengths[b, n])].tolist()
            prefix = torch.tensor([[*PROMPT, *seq[:-1]]])
            logits = model.decoder(prefix, memory[b:b + 1], mask[b:b + 1])[0].double()
            logits[:, [30, 31, 5, 32]] = -math.inf                      # the prompt is banned
            logp = logits.log_softmax(-1)[len(PROMPT) - 1:]            # rows predicting seq
            score = sum(float(logp[i, t]) for i, t in enumerate(seq)) / len(seq)
            assert cached.scores[b, n].item() == pytest.approx(score, abs=1e-4)


def test_eos_equal_to_pad_and_bos_is_never_banned():
    """GPT-2's ids: prompt [eos], pad = eos. Nothing may be banned but suppress_tokens."""
    model = make(prompt=[EOS])
    seen = []
    model.generate(torch.randn(1, 6, IN_DIM), None, max_new_tokens=3, min_new_tokens=0,
                   callback=lambda step, tokens, logits: seen.append(logits.clone()))
    assert all(torch.isfinite(logits).all() for logits in seen)
    # With distinct ids, pad and the prompt are banned as before.
    distinct = make(pad=0, prompt=[1, 30])
    seen.clear()
    distinct.generate(torch.randn(1, 6, IN_DIM), None, max_new_tokens=2,
                      callback=lambda step, tokens, logits: seen.append(logits.clone()))
    banned = torch.isinf(seen[0][0]).nonzero().flatten().tolist()
    assert banned == [0, 1, 30]


def test_prompt_plus_new_tokens_must_fit_max_len():
    model = make()
    memory = torch.randn(1, 3, DIM)
    with pytest.raises(ValueError, match=r"the prompt \(4 tokens\) \+ max_new_tokens \(22\) - 1 "
                                         r"> model.decoder.max_len \(24\)"):
        generate(model.decoder, memory, None, GenerationConfig(max_new_tokens=22),
                 prompt_ids=PROMPT, eos_id=EOS, pad_id=EOS)


ROW_PROMPTS = [[30, 31, 5, 32], [30, 33, 5, 32], [30, 31, 6, 32]]   # language, task per item


@pytest.mark.parametrize("options", [dict(strategy="greedy"),
                                     dict(strategy="beam", num_beams=3, num_return_sequences=2),
                                     dict(strategy="greedy", use_cache=False)],
                         ids=["greedy", "beam", "uncached"])
def test_per_item_prompts_equal_one_call_per_item(options):
    """A (b, p) prompt decodes each item as a call with its own prompt would, its own prompt's
    ids banned in its rows only (33 is not banned in the rows of the other items)."""
    model = make(seed=4)
    x, lengths = torch.randn(3, 6, IN_DIM), torch.tensor([6, 4, 2])
    together = model.generate(x, lengths, max_new_tokens=6, prompt_ids=torch.tensor(ROW_PROMPTS),
                              **options)
    lists = model.generate(x, lengths, max_new_tokens=6, prompt_ids=ROW_PROMPTS, **options)
    assert torch.equal(together.tokens, lists.tokens)
    for i, prompt in enumerate(ROW_PROMPTS):
        alone = model.generate(x[i:i + 1], lengths[i:i + 1], max_new_tokens=6, prompt_ids=prompt,
                               **options)
        width = alone.tokens.shape[-1]
        assert torch.equal(together.tokens[i, ..., :width], alone.tokens[0]), i
        assert (together.tokens[i, ..., width:] == EOS).all()
        torch.testing.assert_close(together.scores[i], alone.scores[0])
    # Control: the rows do differ by prompt, so a prompt mixed up between rows would show.
    swapped = model.generate(x, lengths, max_new_tokens=6,
                             prompt_ids=torch.tensor(ROW_PROMPTS[::-1]), **options)
    assert not torch.allclose(swapped.scores, together.scores)


def test_per_item_prompts_ban_each_rows_own_ids():
    model = make(seed=4)
    seen = []
    model.generate(torch.randn(2, 6, IN_DIM), None, max_new_tokens=1,
                   prompt_ids=torch.tensor(ROW_PROMPTS[:2]),
                   callback=lambda step, tokens, logits: seen.append(logits.clone()))
    banned = [torch.isinf(row).nonzero().flatten().tolist() for row in seen[0]]
    assert banned == [[5, 30, 31, 32], [5, 30, 32, 33]]       # pad = eos is never banned


def test_per_item_prompts_of_different_lengths_are_one_line_errors():
    model = make()
    x = torch.randn(2, 6, IN_DIM)
    with pytest.raises(ValueError, match=r"different lengths \[3, 4\]; every row of a call "
                                         r"needs a prompt of the same length"):
        model.generate(x, None, prompt_ids=[[30, 31, 5, 32], [30, 5, 32]])
    with pytest.raises(ValueError, match=r"3 per-item prompts for a batch of 2"):
        model.generate(x, None, prompt_ids=torch.tensor(ROW_PROMPTS))


def compiled_prompt_case() -> None:
    """Run by tests/unit/decoders/test_compiled_generation.py with its other compiled cases."""
    model = make(seed=3)
    # Two generations with other shapes back to back: the first compiled step of the second
    # must check the compiled graph's guards (the eager prompt step came before it).
    for b, m, options in ((3, 10, {}), (2, 5, dict(strategy="beam", num_beams=3))):
        x, lengths = torch.randn(b, m, IN_DIM), torch.tensor([m, 3, 2][:b])
        eager = model.generate(x, lengths, max_new_tokens=8, min_new_tokens=8, **options)
        compiled = model.generate(x, lengths, max_new_tokens=8, min_new_tokens=8, compile=True,
                                  **options)
        assert torch.equal(compiled.tokens, eager.tokens), (b, m)
        torch.testing.assert_close(compiled.scores, eager.scores, atol=1e-5, rtol=1e-5)
