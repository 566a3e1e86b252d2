"""RotaryEmbedding against a float64 formula, under dtype casts and inference mode."""

from __future__ import annotations

import pytest
import torch

from mmtf.nn import RotaryEmbedding


def rope_reference(x: torch.Tensor, offset: int = 0, base: float = 10000.0) -> torch.Tensor:
    """Half-split rotation in float64: pair (i, i + d/2) at position p turns by p * base^(-2i/d)."""
    x = x.double()
    n, d = x.shape[-2], x.shape[-1]
    pos = torch.arange(offset, offset + n, dtype=torch.float64)
    freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    theta = pos[:, None] * freq[None, :]                                 # (n, d/2)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * theta.cos() - b * theta.sin(), a * theta.sin() + b * theta.cos()], -1)


@pytest.mark.parametrize("cast", ["to_bfloat16", "half"])
def test_tables_stay_float32_when_the_module_is_cast(cast):
    rope = RotaryEmbedding(head_dim=16, max_len=64)
    rope = rope.to(torch.bfloat16) if cast == "to_bfloat16" else rope.half()
    dtype = torch.bfloat16 if cast == "to_bfloat16" else torch.float16
    assert rope.cos.dtype == torch.float32 and rope.sin.dtype == torch.float32
    # Positions 4000..4015 extend the table past max_len=64 after the cast.
    x = torch.randn(1, 2, 16, 16).to(dtype)
    got = rope(x, offset=4000)
    assert got.dtype == dtype and rope.cos.dtype == torch.float32
    ref = rope_reference(x, offset=4000)
    # Only the output rounding to bf16/fp16 remains: |x| < 5, 2^-8 relative.
    torch.testing.assert_close(got.double(), ref, atol=5 * 2 ** -7, rtol=0)


def test_float32_rotation_matches_float64_at_large_positions():
    rope = RotaryEmbedding(head_dim=8, max_len=4)
    x = torch.randn(2, 3, 5, 8)
    torch.testing.assert_close(rope(x, offset=100_000).double(),
                               rope_reference(x, offset=100_000), atol=1e-5, rtol=1e-5)


def test_extending_under_inference_mode_leaves_a_table_training_can_use():
    rope = RotaryEmbedding(head_dim=8, max_len=4)
    with torch.inference_mode():
        rope(torch.randn(1, 1, 10, 8))                                  # extends to 16 rows
    assert rope.max_len >= 10 and not rope.cos.is_inference()
    x = torch.randn(1, 1, 10, 8, requires_grad=True)
    rope(x).square().sum().backward()
    # The rotation is orthogonal: d/dx sum(R x)^2 = 2 x.
    torch.testing.assert_close(x.grad, 2 * x.detach(), atol=1e-5, rtol=1e-5)
