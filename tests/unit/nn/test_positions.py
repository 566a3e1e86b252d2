"""Absolute position tables against their formulas and under cached decoding."""

from __future__ import annotations

import math

import pytest
import torch

from mmtf.decoders.text import TextDecoder
from mmtf.errors import UserError
from mmtf.nn.positions import LearnedPositions, sinusoidal_table
from tests.unit.presets import flat


def test_sinusoidal_table_matches_whisper_formula_written_out():
    n, dim = 7, 8
    table = sinusoidal_table(n, dim)
    # Whisper: log_timescale_increment = ln(10000) / (dim/2 - 1); [sin | cos]
    for p in range(n):
        for k in range(dim // 2):
            angle = p * math.exp(-k * math.log(10000.0) / (dim // 2 - 1))
            assert table[p, k].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[p, dim // 2 + k].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_learned_positions_index_from_the_offset_and_refuse_past_the_table():
    pos = LearnedPositions(5, 4)
    torch.testing.assert_close(pos(2, offset=3)[0], pos.weight[3:5])
    with pytest.raises(UserError, match=r"positions 4..5 exceed the table's 5"):
        pos(2, offset=4)


def test_decoder_with_learned_positions_steps_equal_the_full_pass():
    torch.manual_seed(0)
    dec = flat(TextDecoder, vocab_size=20, dim=16, depth=2, num_heads=2, context_dim=8, max_len=6,
                      positions="learned", bias="qvo", mlp="gelu_tanh").eval()
    assert dec.stack.rope is None
    tokens, memory = torch.randint(0, 20, (2, 5)), torch.randn(2, 3, 8)
    full = dec(tokens, memory)
    cache = dec.make_cache(batch_size=2, context_len=3)
    steps = [dec.step(tokens[:, i:i + 1], cache, memory=memory) for i in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # positions matter: shifting every position changes the logits
    with torch.no_grad():
        dec.positions.weight.copy_(dec.positions.weight.roll(1, dims=0))
    assert not torch.allclose(dec(tokens, memory), full, atol=1e-3)
