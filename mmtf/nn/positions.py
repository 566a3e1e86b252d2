"""Absolute position embeddings beside RoPE: a learned table and Whisper's fixed sinusoids.

Imported models (GPT-2, Whisper, BERT) add a position vector per token; both tables are indexed
from an ``offset`` so a cached step at ``p`` adds what a full pass adds at ``p`` (RoBERTa's table
starts at ``padding_idx + 1``).

Shapes: n positions, c = dim."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmtf.errors import UserError


def sinusoidal_table(num_positions: int, dim: int, *, max_timescale: float = 10000.0) -> Tensor:
    """Whisper's encoder positions, (num_positions, dim) float32: channels ``[sin(p w_k),
    cos(p w_k)]`` for ``k < dim / 2``, ``w_k = max_timescale^(-k / (dim / 2 - 1))``.

    Computed in float64 and rounded once. (Note the ``dim / 2 - 1``: Whisper's exponent, not the
    ``dim / 2`` of the original transformer.)"""
    if dim < 4 or dim % 2:
        raise UserError(f"sinusoidal positions: dim ({dim}) must be even and >= 4.")
    half = dim // 2
    increment = math.log(max_timescale) / (half - 1)
    inv_timescales = torch.exp(-increment * torch.arange(half, dtype=torch.float64))
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * inv_timescales  # (n, c/2)
    return torch.cat([angles.sin(), angles.cos()], dim=1).float()


class LearnedPositions(nn.Module):
    """A learned table of ``num_positions`` vectors of width ``dim`` (GPT-2's ``wpe``).

    Args:
        num_positions, dim: positions the table holds (a forward past them raises); width c.
        init_std: standard deviation of the normal initialisation (GPT-2's 0.02).
    """

    def __init__(self, num_positions: int, dim: int, *, init_std: float = 0.02) -> None:
        super().__init__()
        if num_positions < 1:
            raise UserError(f"LearnedPositions: num_positions ({num_positions}) must be >= 1.")
        self.num_positions = num_positions
        self.weight = nn.Parameter(torch.empty(num_positions, dim))
        nn.init.normal_(self.weight, std=init_std)

    def forward(self, length: int, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Vectors of positions ``offset .. offset + length - 1``, (1, n, c); or, given
        ``positions`` (b, n) long (each row's own, e.g. counting real tokens only), their
        vectors (b, n, c). Every position must be < ``offset + length``, so the bound is
        checked without reading the tensor."""
        if offset + length > self.num_positions:
            raise UserError(f"LearnedPositions: positions {offset}..{offset + length - 1} "
                            f"exceed the table's {self.num_positions}; truncate the sequence "
                            f"(it was trained with at most {self.num_positions} positions).")
        if positions is not None:
            return self.weight[positions]                                 # (b, n, c)
        return self.weight[offset:offset + length][None]


class FixedPositions(nn.Module):
    """A fixed table (e.g. :func:`sinusoidal_table`), kept as a persistent buffer so an import
    can compare it with the original's stored table, and indexed like :class:`LearnedPositions`."""

    def __init__(self, table: Tensor) -> None:
        super().__init__()
        self.num_positions = table.shape[0]
        self.register_buffer("weight", table)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Vectors of positions ``offset .. offset + length - 1``, (1, n, c)."""
        if offset + length > self.num_positions:
            raise UserError(f"FixedPositions: positions {offset}..{offset + length - 1} exceed "
                            f"the table's {self.num_positions}; crop the input.")
        return self.weight[offset:offset + length][None]
