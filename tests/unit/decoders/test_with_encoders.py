"""The decoder with the real mmtf encoders, composed the way a task config composes them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtf.decoders import EncoderDecoder

MODEL = Path(__file__).resolve().parents[3] / "conf" / "model"


def build(encoder: str) -> EncoderDecoder:
    cfg = OmegaConf.create({"model": {
        "_target_": "mmtf.decoders.EncoderDecoder",
        "encoder": OmegaConf.load(MODEL / "encoder" / f"{encoder}.yaml"),
        "decoder": OmegaConf.merge(OmegaConf.load(MODEL / "decoder" / "text_tiny.yaml"),
                                   {"vocab_size": 50, "context_dim": "${model.encoder.dim}"}),
    }})
    return instantiate(cfg.model)


@pytest.mark.parametrize("encoder", ["audio_tiny", "vision_tiny"])
def test_teacher_forcing_and_generation_with_real_encoders(encoder):
    model = build(encoder)
    if encoder == "audio_tiny":
        inputs, lengths = torch.randn(2, 8000), torch.tensor([8000, 4000])   # 0.5 s, 0.25 s
    else:
        inputs, lengths = torch.randn(2, 3, 32, 32), None
    tokens = torch.tensor([[1, 7, 8, 2, 0], [1, 9, 2, 0, 0]])
    out = model(inputs, lengths, tokens)
    assert out.logits.shape == (2, 4, 50) and torch.isfinite(out.loss)
    out.loss.backward()
    model.eval()
    cached = model.generate(inputs, lengths, max_new_tokens=6)
    ref = model.generate(inputs, lengths, max_new_tokens=6, use_cache=False)
    assert torch.equal(cached.tokens, ref.tokens)
    beam = model.generate(inputs, lengths, strategy="beam", num_beams=2, max_new_tokens=6)
    assert beam.tokens.shape[0] == 2
