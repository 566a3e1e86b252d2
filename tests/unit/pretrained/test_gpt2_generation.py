"""Greedy and beam tokens of a ViT + GPT-2 captioner imported into mmtf (KV cache) equal
``VisionEncoderDecoderModel.generate`` on the same weights, with GPT-2's conventions
(bos = eos = pad = <|endoftext|>, the prompt is that one token)."""

from __future__ import annotations

import pytest
import torch

from mmtf.decoders import EncoderDecoder
from mmtf.pretrained.gpt2 import gpt2_decoder
from mmtf.pretrained.vit import vit_encoder

from .test_gpt2 import DECODER, TINY
from .vision_folders import TINY as TINY_VIT
from .vision_folders import VIT_ENCODER, perturb

transformers = pytest.importorskip("transformers")
EOS = TINY["eos_token_id"]
# <|endoftext|> grows likelier with the position (added to wpe), so rows end at different steps.
EOS_DRIFT = 0.2


@pytest.fixture(scope="module")
def captioners(tmp_path_factory):
    """The same random ViT + GPT-2 captioner in transformers and in mmtf."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTModel,
    )

    torch.manual_seed(0)
    reference = VisionEncoderDecoderModel(
        encoder=ViTModel(ViTConfig(**TINY_VIT), add_pooling_layer=False),
        decoder=GPT2LMHeadModel(GPT2Config(**TINY, add_cross_attention=True)))
    perturb(reference)
    with torch.no_grad():
        eos = reference.decoder.transformer.wte.weight[EOS]
        steps = torch.arange(TINY["n_positions"], dtype=torch.float32)[:, None]
        reference.decoder.transformer.wpe.weight += EOS_DRIFT * steps * eos / eos.norm()
    reference.config.decoder_start_token_id = reference.config.pad_token_id = EOS
    reference.config.eos_token_id = EOS
    reference.eval()
    folder = tmp_path_factory.mktemp("ved")
    reference.save_pretrained(folder)
    ours = EncoderDecoder(encoder=vit_encoder(**VIT_ENCODER, pretrained=folder),
                          decoder=gpt2_decoder(**{**DECODER, "pad_id": EOS}, pretrained=folder),
                          pad_id=EOS, eos_id=EOS, prompt_ids=[EOS]).eval()
    return reference, ours


def _hf_tokens(reference, images, **options):
    out = reference.generate(pixel_values=images, max_new_tokens=12, do_sample=False,
                             decoder_start_token_id=EOS, pad_token_id=EOS, eos_token_id=EOS,
                             **options)
    return out[:, 1:]                                                     # without the prompt


def _same_tokens(ours, theirs):
    width = max(ours.shape[1], theirs.shape[1])
    pad = [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=EOS) for t in (ours, theirs)]
    assert torch.equal(*pad), (ours, theirs)


def test_greedy_tokens_match(captioners):
    reference, ours = captioners
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = _hf_tokens(reference, images)
    out = ours.generate(images, strategy="greedy", max_new_tokens=12)
    assert len(set(out.lengths.tolist())) > 1 and out.lengths.max() < 12   # rows stop apart
    _same_tokens(out.tokens, theirs)


@pytest.mark.parametrize("length_penalty", [1.0, 0.0])
def test_beam_tokens_match(captioners, length_penalty):
    reference, ours = captioners
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = _hf_tokens(reference, images, num_beams=4, early_stopping=True,
                            length_penalty=length_penalty)
    got = ours.generate(images, strategy="beam", num_beams=4, max_new_tokens=12,
                        early_stopping=True, length_penalty=length_penalty).tokens
    _same_tokens(got, theirs)
