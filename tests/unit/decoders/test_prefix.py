"""The multimodal prefix model: the one shifted loss against a float64 loop, the splice with left
and right padding against each item run alone on hand-concatenated embeddings, batched
generation against one prompt at a time and an uncached greedy loop, vocab growth and bad
inputs."""

from __future__ import annotations

import pytest
import torch

from mmtf.decoders.prefix import MediaPrefixLM, answer_loss
from mmtf.errors import UserError
from mmtf.pretrained.llm import llm_decoder
from tests.unit.decoders.stubs import StubEncoder

VOCAB, MEDIA, EOS, PAD = 50, 49, 2, 0
IN_DIM, ENC_DIM = 5, 16
# Items: text ids with the placeholder, and frames of media. A chat-like layout:
# [system, user, <media>, question ..., assistant marker (9), answer ..., eos].
ASSISTANT = 9
ITEMS = [
    ([5, 6, MEDIA, 7, 8, 9, 10, 11, 12, EOS], 7),    # 7 frames -> 4 media positions (k=2)
    ([5, 6, MEDIA, 13, 9, 14, EOS], 2),               # 2 frames -> 1
    ([5, 6, MEDIA, 7, 15, 16, 9, 17, EOS], 5),        # 5 frames -> 3
]


def answer_from(text: list[int]) -> int:
    """Index of the first trained token: the one after the assistant marker."""
    return text.index(ASSISTANT) + 1


def make_model(seed: int = 0, *, tie: bool = False, max_len: int = 64,
               projector: dict | None = None) -> MediaPrefixLM:
    torch.manual_seed(seed)
    lm = llm_decoder(vocab_size=VOCAB, dim=32, depth=2, num_heads=4, num_kv_heads=2,
                     mlp_hidden=48, max_len=max_len, eos_id=EOS, pad_id=PAD, tie_embeddings=tie)
    with torch.no_grad():                # sharper than 0.02: greedy choices well separated
        lm.embed.weight.normal_(0.0, 0.5)
    model = MediaPrefixLM(encoder=StubEncoder(in_dim=IN_DIM, dim=ENC_DIM), decoder=lm,
                          projector=projector or {"kind": "concat", "k": 2},
                          media_token_id=MEDIA)
    return model.eval()


def media_batch(items=ITEMS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames (b, n, IN_DIM), zero past each item's length, and their (b, n) bool mask."""
    g = torch.Generator().manual_seed(seed)
    n = max(f for _, f in items)
    lengths = torch.tensor([f for _, f in items])
    mask = torch.arange(n)[None] < lengths[:, None]
    return torch.randn(len(items), n, IN_DIM, generator=g) * mask[..., None], mask


def text_batch(texts, side: str, labels: bool = False):
    """input_ids, 0/1 attention_mask (and labels: -100 but on the answers) padded on ``side``."""
    width = max(len(t) for t in texts)
    ids = torch.full((len(texts), width), PAD)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    lab = torch.full((len(texts), width), -100)
    for i, t in enumerate(texts):
        cols = slice(width - len(t), width) if side == "left" else slice(0, len(t))
        ids[i, cols], mask[i, cols] = torch.tensor(t), 1
        lab[i, cols] = torch.tensor([tok if j >= answer_from(t) else -100
                                     for j, tok in enumerate(t)])
    return (ids, mask, lab) if labels else (ids, mask)


def alone(model: MediaPrefixLM, text: list[int], frames: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Logits (L, v) of one item without padding, its embeddings concatenated by hand, and its
    media length."""
    lm = model.decoder
    p = text.index(MEDIA)
    enc = model.encoder(frames[None])
    media = model.projector(enc.memory, enc.mask).embeds[0]              # (m, c), all valid
    embeds = torch.cat([lm.embed(torch.tensor(text[:p])), media,
                        lm.embed(torch.tensor(text[p + 1:]))])          # (L, c)
    return lm(inputs_embeds=embeds[None])[0], media.shape[0]


@pytest.mark.parametrize("side", ["left", "right"])
def test_splice_equals_each_item_alone(side):
    model = make_model()
    media, media_mask = media_batch()
    ids, mask = text_batch([t for t, _ in ITEMS], side)
    seen = {}
    model.decoder.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.update(kwargs), with_kwargs=True)
    with torch.no_grad():
        out = model(media, media_mask, ids, mask)
        projected = model.encode(media, media_mask)
    fed = dict(seen)                                     # what the batch fed the LLM
    lengths = [len(t) - 1 + (f + 1) // 2 for t, f in ITEMS]             # text - 1 + ceil(f / 2)
    width = max(lengths)
    assert out.logits.shape == (3, width, VOCAB)
    for i, (text, frames) in enumerate(ITEMS):
        with torch.no_grad():
            expected, m = alone(model, text, media[i, :frames])
        start = width - lengths[i] if side == "left" else 0
        cols = slice(start, start + lengths[i])
        assert fed["attention_mask"][i].sum() == lengths[i]
        assert fed["attention_mask"][i, cols].all()
        torch.testing.assert_close(out.logits[i, cols], expected, atol=1e-5, rtol=1e-5)
        # The media positions hold exactly the projector's output, the rest the text's rows.
        p = text.index(MEDIA)
        media_cols = slice(start + p, start + p + m)
        embeds = fed["inputs_embeds"][i]
        assert torch.equal(embeds[media_cols], projected.embeds[i, :m])
        rest = torch.cat([embeds[start:start + p], embeds[start + p + m:start + lengths[i]]])
        assert torch.equal(rest, model.decoder.embed(torch.tensor(text[:p] + text[p + 1:])))
        assert torch.equal(out.inputs.media_positions[i].nonzero().flatten(),
                           torch.arange(start + p, start + p + m))


def test_answer_loss_equals_a_float64_loop_over_the_answer_tokens():
    model = make_model()
    media, media_mask = media_batch()
    ids, mask, labels = text_batch([t for t, _ in ITEMS], "left", labels=True)
    with torch.no_grad():
        out = model(media, media_mask, ids, mask, labels)
    logits = out.logits.double()
    width = logits.shape[1]
    total, count = 0.0, 0
    for i, (text, frames) in enumerate(ITEMS):
        m = (frames + 1) // 2
        start = width - (len(text) - 1 + m)
        p = text.index(MEDIA)
        for j in range(answer_from(text), len(text)):   # the answer tokens only
            pos = start + j + m - 1                       # j > p: after the media
            assert j > p
            # Explicit shift: the token at pos is predicted by the logits at pos - 1.
            total -= torch.log_softmax(logits[i, pos - 1], dim=-1)[text[j]].item()
            count += 1
    assert count == 4 + 2 + 2
    assert abs(out.loss.item() - total / count) < 1e-5
    # The function alone, on a hand-worked case: 2 positions, the second trained.
    toy = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [1.0, 1.0, 1.0]]]))
    assert torch.isclose(answer_loss(toy, torch.tensor([[-100, 1]])), -torch.log(torch.tensor(0.25)))
    assert answer_loss(toy, torch.tensor([[-100, -100]])) == 0


def test_batched_left_padded_generate_equals_one_at_a_time():
    model = make_model()
    media, media_mask = media_batch()
    prompts = [t[:answer_from(t)] for t, _ in ITEMS]  # each ends with the assistant marker
    ids, mask = text_batch(prompts, "left")
    out = model.generate(media, media_mask, ids, mask, strategy="greedy", max_new_tokens=6)
    right = model.generate(media, media_mask, *text_batch(prompts, "right"),
                           strategy="greedy", max_new_tokens=6)
    assert torch.equal(out.tokens, right.tokens)
    for i, (_, frames) in enumerate(ITEMS):
        one = model.generate(media[i:i + 1, :frames], None, torch.tensor([prompts[i]]),
                             strategy="greedy", max_new_tokens=6)
        n = int(one.lengths[0])
        assert int(out.lengths[i]) == n
        assert torch.equal(out.tokens[i, :n], one.tokens[0, :n])
    # One item against an uncached greedy loop over the whole forward pass.
    text = list(prompts[0])
    for _ in range(int(out.lengths[0])):
        with torch.no_grad():
            logits = model(media[:1, :7], None, torch.tensor([text])).logits[0, -1]
        logits[MEDIA] = -float("inf")                    # the placeholder is never generated
        logits[PAD] = -float("inf")                      # nor pad (generation bans it)
        text.append(int(logits.argmax()))
        if text[-1] == EOS:
            break
    assert text[len(prompts[0]):] == out.tokens[0, :int(out.lengths[0])].tolist()


def test_items_without_their_one_placeholder_are_refused():
    model = make_model()
    media, media_mask = media_batch()
    texts = [t for t, _ in ITEMS]
    for bad, count in (([5, 6, 9, EOS], 0), ([5, MEDIA, 6, MEDIA, 9, EOS], 2)):
        ids, mask = text_batch([texts[0], bad, texts[2]], "right")
        with pytest.raises(UserError, match=f"item 1 of the batch holds {count} media "
                                            f"placeholders \\(id {MEDIA}\\)"):
            model(media, media_mask, ids, mask)
    # A placeholder id on a padding position does not count.
    ids, mask = text_batch(texts, "right")
    ids[1, -1] = MEDIA
    model(media, media_mask, ids, mask)


def test_spliced_length_past_the_positions_is_refused_naming_both():
    model = make_model(max_len=10)
    media, media_mask = media_batch()
    ids, mask = text_batch([t for t, _ in ITEMS], "left")
    with pytest.raises(UserError, match=r"item 0 is 13 positions once spliced \(9 text tokens "
                                        r"\+ 4 media positions\), more than the LLM's 10"):
        model(media, media_mask, ids, mask)


@pytest.mark.parametrize("tie", [False, True])
def test_grow_vocab_adds_mean_rows_to_embedding_and_head(tie):
    model = make_model(tie=tie)
    lm = model.decoder
    embed, head = lm.embed.weight.clone(), lm.lm_head.weight.clone()
    x = torch.randint(0, VOCAB, (2, 5))
    with torch.no_grad():
        before = lm(x)
    assert lm.grow_vocab(3) == range(VOCAB, VOCAB + 3)
    assert lm.vocab_size == VOCAB + 3 and lm.embed.weight.shape == (VOCAB + 3, 32)
    assert (lm.lm_head.weight is lm.embed.weight) == tie
    assert torch.equal(lm.embed.weight[:VOCAB], embed)
    assert torch.allclose(lm.embed.weight[VOCAB:], embed.mean(0).expand(3, -1))
    assert torch.allclose(lm.lm_head.weight[VOCAB:], head.mean(0).expand(3, -1))
    with torch.no_grad():
        after = lm(x)
    torch.testing.assert_close(after[..., :VOCAB], before)
    # A mean head row scores the mean of the other logits (the head is linear).
    torch.testing.assert_close(after[..., VOCAB], before.mean(-1), atol=1e-5, rtol=1e-5)


def test_a_placeholder_past_the_vocab_is_refused_or_grown():
    torch.manual_seed(0)
    lm = llm_decoder(vocab_size=VOCAB, dim=32, depth=1, num_heads=4, max_len=32, eos_id=EOS)
    enc = StubEncoder(in_dim=IN_DIM, dim=ENC_DIM)
    with pytest.raises(UserError, match=r"media_token_id \(51\) is past the LLM's vocabulary "
                                        r"\(50 rows\); set model.grow_vocab=true to add 2"):
        MediaPrefixLM(encoder=enc, decoder=lm, projector="linear", media_token_id=51)
    model = MediaPrefixLM(encoder=enc, decoder=lm, projector="linear", media_token_id=51,
                          grow_vocab=True)
    assert model.decoder.vocab_size == 52
    out = model(torch.randn(1, 3, IN_DIM), None, torch.tensor([[5, 51, 6]]))
    assert out.logits.shape == (1, 5, 52)


def test_the_placeholder_is_never_generated():
    model = make_model()
    with torch.no_grad():                # the placeholder would win every step
        model.decoder.lm_head.weight[MEDIA] = 10 * model.decoder.lm_head.weight[EOS].abs()
    media, media_mask = media_batch()
    prompts = [t[:answer_from(t)] for t, _ in ITEMS]
    out = model.generate(media, media_mask, *text_batch(prompts, "left"), max_new_tokens=4)
    with torch.no_grad():
        logits = model(media, media_mask, *text_batch(prompts, "left")).logits[:, -1]
    assert (logits.argmax(-1) == MEDIA).all()
    assert not (out.tokens == MEDIA).any()
