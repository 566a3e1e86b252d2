"""Fixtures for the decoder tests: a tiny random encoder-decoder on the stub encoder."""

from __future__ import annotations

import pytest
import torch

from mmtf.decoders import EncoderDecoder, TextDecoder
from tests.unit.decoders.stubs import StubEncoder
from tests.unit.presets import flat

VOCAB, DIM, IN_DIM = 40, 32, 6


def make_model(seed: int = 0, *, depth: int = 2, num_kv_heads: int | None = None,
               tie_embeddings: bool = True, label_smoothing: float = 0.0) -> EncoderDecoder:
    torch.manual_seed(seed)
    enc = StubEncoder(in_dim=IN_DIM, dim=DIM)
    dec = flat(TextDecoder, vocab_size=VOCAB, dim=DIM, depth=depth, num_heads=4,
                      num_kv_heads=num_kv_heads, context_dim=DIM, max_len=32,
                      tie_embeddings=tie_embeddings)
    # Sharper than the 0.02 init so the next-token distributions are far from uniform and
    # greedy/beam decisions are well separated.
    with torch.no_grad():
        dec.embed.weight.normal_(0.0, 0.5)
    return EncoderDecoder(encoder=enc, decoder=dec, label_smoothing=label_smoothing).eval()


@pytest.fixture
def model() -> EncoderDecoder:
    return make_model()


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Features (3, 7, IN_DIM) with memory lengths 7, 4, 2 (padding that actually masks)."""
    return torch.randn(3, 7, IN_DIM), torch.tensor([7, 4, 2])
