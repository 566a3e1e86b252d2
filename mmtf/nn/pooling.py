"""Attention pooling: one learned query attends over an encoder's valid positions.

The alternative to a masked mean (:func:`mmtf.encoders.pool`) when the positions that matter
differ per item (a short event in a long clip). Cross-attention of the one attention core
(:class:`mmtf.nn.attention.Attention`), as the pooling heads of CLAP's HTS-AT variants and of
SigLIP ("MAP head").

Shapes: b batch, s positions, c = dim.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmtf.nn.attention import Attention


class AttentionPool(nn.Module):
    """Pool (b, s, c) to (b, c): a learned query cross-attends to the layer-normed positions.

    Args:
        dim: c, the width of the memory and of the result.
        num_heads: attention heads (``dim`` divisible by it).
    """

    def __init__(self, *, dim: int, num_heads: int = 4) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.query = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.attn = Attention(dim=dim, num_heads=num_heads, kv_dim=dim, bias=True)

    def forward(self, memory: Tensor, mask: Tensor | None = None) -> Tensor:
        """memory (b, s, c), mask (b, s) bool True = valid (None: all) -> (b, c)."""
        query = self.query.expand(memory.shape[0], -1, -1)                  # (b, 1, c)
        return self.attn(query, self.norm(memory), key_mask=mask)[:, 0]     # (b, c)
