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


# ---------------------------------------------------------------------------- scaling
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_scaled_frequencies_match_transformers(kind):
    """transformers' ROPE_INIT_FUNCTIONS (float32) as the reference; dynamic at a length past
    the trained 128 positions, where its base grows."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2,
                                      max_position_embeddings=128, rope_theta=5000.0,
                                      rope_scaling=SCALINGS[kind])
    theirs, _ = ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=300 if kind == "dynamic"
                                          else None)
    scaling = {**SCALINGS[kind], "max_position_embeddings": 128}
    rope = RotaryEmbedding(head_dim=32, base=5000.0, scaling=scaling)
    ours = rope.inv_freq(300 if kind == "dynamic" else None)
    torch.testing.assert_close(ours.float(), theirs, rtol=1e-6, atol=0)
    assert not torch.allclose(ours, RotaryEmbedding(head_dim=32, base=5000.0).inv_freq())


def test_dynamic_frequencies_grow_past_the_trained_length_and_reset_within_it():
    rope = RotaryEmbedding(head_dim=8, max_len=16,
                           scaling={**SCALINGS["dynamic"], "max_position_embeddings": 16})
    plain = rope.cos.clone()
    x = torch.randn(1, 1, 20, 8)
    rope(x)                                                  # 20 > 16: a larger base
    assert rope.freq_len == 20 and not torch.allclose(rope.cos[:16], plain)
    rope(x[:, :, :18])                                       # shorter, still past 16: kept
    assert rope.freq_len == 20
    rope(x[:, :, :4])                                        # within 16: the trained ones
    assert rope.freq_len == 16 and torch.equal(rope.cos[:16], plain)


def test_per_row_positions_equal_the_shared_offset():
    rope = RotaryEmbedding(head_dim=8, max_len=4)
    x = torch.randn(2, 3, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    got = rope(x, offset=7, positions=positions)
    torch.testing.assert_close(got[0], rope(x[:1], offset=0)[0])
    torch.testing.assert_close(got[1], rope(x[1:], offset=7)[0])


def test_unknown_scaling_type_names_the_supported_ones():
    from mmtf.errors import UserError

    with pytest.raises(UserError, match=r"'yarn' is not supported.*linear, llama3, dynamic"):
        RotaryEmbedding(head_dim=8, scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(UserError, match=r"'llama3' needs low_freq_factor"):
        RotaryEmbedding(head_dim=8, scaling={"rope_type": "llama3", "factor": 8.0})
