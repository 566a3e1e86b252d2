"""The maps drawn are the ones the model used for the caption it generates, and asking for
them changes nothing: same caption as plain generation, same logits, same memory."""

from __future__ import annotations

import pytest
import torch

from mmtf.decoders import EncoderDecoder, TextDecoder
from mmtf.encoders import AudioEncoder, VisionEncoder
from mmtf.errors import UserError
from mmtf.inspect import caption_attention
from tests.unit.presets import flat

VOCAB = 24


class WordTokenizer:
    """id i -> the word "w<i>" (specials 0-2 dropped), enough for decode."""

    def decode(self, ids, skip_special: bool = True):
        return " ".join(f"w{i}" for i in ids if not (skip_special and i < 3))


def audio_model(seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    encoder = flat(AudioEncoder, dim=32, depth=2, num_heads=4, n_mels=16, freq_mask_width=4)
    decoder = flat(TextDecoder, vocab_size=VOCAB, dim=32, depth=2, num_heads=4, context_dim=32,
                          max_len=16)
    with torch.no_grad():       # sharp next-token distributions: greedy choices well apart
        decoder.embed.weight.normal_(0.0, 0.7)
    return EncoderDecoder(encoder=encoder, decoder=decoder)


def padded_clip() -> tuple[torch.Tensor, torch.Tensor]:
    """1 s of noise padded to 1.5 s: memory positions past the clip are masked."""
    torch.manual_seed(3)
    wave = torch.zeros(1, 24000)
    wave[0, :16000] = torch.randn(16000) * 0.1
    return wave, torch.tensor([16000])


def test_caption_is_the_plain_generation_and_rows_reproduce_its_tokens():
    model = audio_model().eval()
    wave, lengths = padded_clip()
    plain = model.generate(wave, lengths, max_new_tokens=10).tokens[0].tolist()
    got = caption_attention(model, wave, lengths, WordTokenizer(), cross_layers=[0, 1],
                            generation={"max_new_tokens": 10})
    n = len(got.tokens)
    assert got.tokens.tolist() == plain[:n] and all(t == model.pad_id for t in plain[n:])
    assert got.caption == WordTokenizer().decode(plain)
    # The inspection pass decodes the same caption: each row's argmax (over the tokens
    # generation may pick: never pad or bos) is the generated token.
    allowed = got.logits.clone()
    allowed[:, [model.pad_id, *model.prompt_ids]] = float("-inf")
    assert allowed.argmax(-1).tolist() == got.tokens.tolist()
    # and its logits are the cached generation's logits (recomputed here, fused kernels)
    memory, mask = model.encode(wave, lengths)
    queries = torch.cat([torch.tensor([model.prompt_ids]), got.tokens[None, :-1]], dim=1)
    with torch.no_grad():
        fused = model.decoder(queries, memory, mask)[0]
    torch.testing.assert_close(got.logits, fused, atol=1e-5, rtol=1e-5)


def test_cross_maps_sum_to_one_and_padding_gets_exactly_zero():
    model = audio_model().eval()
    wave, lengths = padded_clip()
    got = caption_attention(model, wave, lengths, WordTokenizer(), cross_layers=[1],
                            decoder_self_layers=[0], encoder_self_layers=[1],
                            generation={"max_new_tokens": 6})
    assert sorted(got.cross) == [1] and sorted(got.decoder_self) == [0]
    valid = got.memory_mask
    assert valid.sum() == model.encoder.output_lengths(lengths)[0] < valid.numel()
    w = got.cross[1]                                                        # (h, n, m)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))
    assert torch.equal(w[:, :, ~valid], torch.zeros_like(w[:, :, ~valid]))
    enc = got.encoder_self[1]                                               # (h, m, m)
    assert torch.equal(enc[:, valid][:, :, ~valid], torch.zeros_like(enc[:, valid][:, :, ~valid]))
    torch.testing.assert_close(enc[:, valid].sum(-1), torch.ones(enc.shape[0], int(valid.sum())))


def test_encoder_maps_leave_the_memory_unchanged():
    model = audio_model().eval()
    wave, lengths = padded_clip()
    with torch.no_grad():
        plain = model.encoder(wave, lengths)
        out, maps = model.encoder(wave, lengths, attention_layers={"self": [0]})
    torch.testing.assert_close(out.memory, plain.memory, atol=1e-5, rtol=1e-5)
    assert list(maps) == ["self"] and list(maps["self"]) == [0]


def test_vision_maps_cover_cls_and_patches():
    torch.manual_seed(0)
    encoder = flat(VisionEncoder, dim=32, depth=2, num_heads=4, patch_size=8, image_size=32).eval()
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        plain = encoder(images)
        out, maps = encoder(images, attention_layers={"self": [-1]})
    torch.testing.assert_close(out.memory, plain.memory, atol=1e-5, rtol=1e-5)
    assert maps["self"][1].shape == (1, 4, 17, 17)                         # CLS + 4 x 4 patches
    torch.testing.assert_close(maps["self"][1].sum(-1), torch.ones(1, 4, 17))


def test_train_and_eval_states_are_restored():
    model = audio_model().train()
    model.encoder.stack.eval()                   # a mixed state must come back as it was
    before = {name: m.training for name, m in model.named_modules()}
    wave, lengths = padded_clip()
    caption_attention(model, wave, lengths, WordTokenizer(), generation={"max_new_tokens": 3})
    assert {name: m.training for name, m in model.named_modules()} == before


def test_sampling_is_refused_and_batches_too():
    model = audio_model().eval()
    wave, lengths = padded_clip()
    with pytest.raises(UserError, match="strategy=sample"):
        caption_attention(model, wave, lengths, WordTokenizer(), generation={"strategy": "sample"})
    with pytest.raises(ValueError, match="one input at a time"):
        caption_attention(model, wave.repeat(2, 1), lengths.repeat(2), WordTokenizer())
