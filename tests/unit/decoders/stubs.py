"""Stand-ins for the decoder tests: a tiny encoder and a table-driven toy decoder.

StubEncoder is a per-frame Linear on random features (so the memory of a truncated input is the
prefix of the full memory); IdentityEncoder passes features through. ToyDecoder has the
TextDecoder step API but reads next-token probabilities from a hand-written table keyed by
(row kind, generated prefix), so the best sequences are known by hand. The row kind is
``round(memory[row, 0, 0])``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

PAD, BOS, EOS, UNK = 0, 1, 2, 3


class StubOutput(NamedTuple):
    memory: Tensor
    mask: Tensor


def lengths_to_mask(lengths: Tensor | None, b: int, m: int) -> Tensor:
    if lengths is None:
        return torch.ones(b, m, dtype=torch.bool)
    return torch.arange(m)[None, :] < lengths[:, None]


class StubEncoder(nn.Module):
    """features (b, m, in_dim) -> memory (b, m, dim) with a Linear; mask from lengths."""

    def __init__(self, *, in_dim: int, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.proj = nn.Linear(in_dim, dim)
        self.calls = 0

    def forward(self, inputs: Tensor, lengths: Tensor | None = None) -> StubOutput:
        self.calls += 1
        mask = lengths_to_mask(lengths, inputs.shape[0], inputs.shape[1])
        return StubOutput(self.proj(inputs) * mask[..., None], mask)


class IdentityEncoder(nn.Module):
    def __init__(self, *, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, inputs: Tensor, lengths: Tensor | None = None) -> StubOutput:
        return StubOutput(inputs, lengths_to_mask(lengths, inputs.shape[0], inputs.shape[1]))


Table = dict[tuple[int, ...], dict[int, float]]


class ToyCache:
    """Per-row generated prefixes; reorder follows beams like a KV cache would."""

    def __init__(self, rows: int) -> None:
        self.prefix: list[list[int]] = [[] for _ in range(rows)]
        self.kind: list[int] = []
        self.reorders = 0

    @property
    def filled(self) -> bool:
        return bool(self.kind)

    def reorder(self, index: Tensor) -> None:
        self.reorders += 1
        idx = index.tolist()
        self.prefix = [list(self.prefix[i]) for i in idx]
        self.kind = [self.kind[i] for i in idx]


class ToyDecoder(nn.Module):
    """Log-probs from ``tables[kind][prefix]`` (probabilities; missing tokens have prob 0)."""

    def __init__(self, *, tables: dict[int, Table], vocab_size: int, default: dict[int, float],
                 context_dim: int = 2, max_len: int = 16) -> None:
        super().__init__()
        self.tables, self.default = tables, default
        self.vocab_size, self.context_dim, self.max_len, self.pad_id = (
            vocab_size, context_dim, max_len, PAD)
        self.steps = 0

    def logprobs(self, kind: int, prefix: tuple[int, ...]) -> Tensor:
        out = torch.full((self.vocab_size,), -math.inf)
        for token, p in self.tables[kind].get(prefix, self.default).items():
            out[token] = math.log(p)
        return out

    def make_cache(self, *, batch_size: int, context_len: int, max_len: int | None = None,
                   ) -> ToyCache:
        return ToyCache(batch_size)

    def step(self, tokens: Tensor, cache: ToyCache, *, memory: Tensor | None = None,
             memory_mask: Tensor | None = None) -> Tensor:
        self.steps += 1
        if not cache.filled:
            cache.kind = memory[:, 0, 0].round().long().tolist()
        for row, token in enumerate(tokens[:, -1].tolist()):
            if token != BOS:
                cache.prefix[row].append(token)
        rows = [self.logprobs(k, tuple(p)) for k, p in zip(cache.kind, cache.prefix)]
        return torch.stack(rows)[:, None]                                # (b, 1, v)

    def forward(self, tokens: Tensor, memory: Tensor, memory_mask: Tensor | None = None) -> Tensor:
        kinds = memory[:, 0, 0].round().long().tolist()
        seqs = tokens[:, 1:].tolist()
        return torch.stack([
            torch.stack([self.logprobs(k, tuple(s[:i])) for i in range(tokens.shape[1])])
            for k, s in zip(kinds, seqs)])                               # (b, n, v)


def toy_inputs(kinds: list[int], dim: int = 2, m: int = 3) -> Tensor:
    """Inputs for IdentityEncoder whose memory[:, 0, 0] is the row kind."""
    x = torch.zeros(len(kinds), m, dim)
    x[:, 0, 0] = torch.tensor(kinds, dtype=torch.float)
    return x
