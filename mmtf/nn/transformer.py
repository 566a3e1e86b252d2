"""Pre-norm transformer block and stack built on the one attention core.

A block is: x + SelfAttn(Norm(x)), [x + CrossAttn(Norm(x), context)], x + MLP(Norm(x)).
Encoders build it with ``causal=False``, decoders with ``causal=True`` and ``cross_dim`` set.

Shapes: b batch, n sequence length, m context length, c = dim.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.errors import UserError
from mmtf.nn.attention import Attention
from mmtf.nn.kv_cache import KVCache
from mmtf.nn.rope import RotaryEmbedding

NormKind = Literal["layernorm", "rmsnorm"]
MlpKind = Literal["gelu", "swiglu"]


def make_norm(kind: NormKind, dim: int, eps: float = 1e-5) -> nn.Module:
    """LayerNorm or RMSNorm of width ``dim``."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise UserError(f"norm ({kind!r}) must be 'layernorm' or 'rmsnorm'.")


class MLP(nn.Module):
    """Feed-forward layer: GELU (c -> 4c -> c) or SwiGLU (Shazeer 2020, arXiv:2002.05202).

    SwiGLU uses 2/3 of the hidden width so both kinds have the same parameter count.
    """

    def __init__(self, *, dim: int, mlp_ratio: float = 4.0, kind: MlpKind = "gelu",
                 dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        if kind not in ("gelu", "swiglu"):
            raise UserError(f"MLP: mlp ({kind!r}) must be 'gelu' or 'swiglu'.")
        if mlp_ratio <= 0:
            raise UserError(f"MLP: mlp_ratio ({mlp_ratio}) must be > 0.")
        self.kind = kind
        hidden = int(dim * mlp_ratio)
        if kind == "swiglu":
            hidden = max(1, int(2 * hidden / 3))
            self.fc_in = nn.Linear(dim, 2 * hidden, bias=bias)
        else:
            self.fc_in = nn.Linear(dim, hidden, bias=bias)
        self.fc_out = nn.Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x: (b, n, c) -> (b, n, c)."""
        h = self.fc_in(x)
        if self.kind == "swiglu":
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        else:
            h = F.gelu(h)
        return self.drop(self.fc_out(h))


class TransformerBlock(nn.Module):
    """Pre-norm block: self-attention, optional cross-attention, MLP, each with a residual.

    Args:
        dim: width c.
        num_heads, num_kv_heads: attention heads (grouped-query when they differ).
        causal: causal self-attention (decoders) or bidirectional (encoders).
        cross_dim: width of the cross-attention context; None = no cross-attention.
        rope: shared rotary table for self-attention, or None.
        mlp_ratio, mlp: hidden width ratio and kind ("gelu" or "swiglu").
        norm: "layernorm" or "rmsnorm".
        dropout: residual and MLP dropout. attn_dropout: attention-probability dropout.
        bias: biases in linear layers.
    """

    def __init__(self, *, dim: int, num_heads: int, num_kv_heads: int | None = None,
                 causal: bool = False, cross_dim: int | None = None,
                 rope: RotaryEmbedding | None = None, mlp_ratio: float = 4.0,
                 mlp: MlpKind = "gelu", norm: NormKind = "layernorm", dropout: float = 0.0,
                 attn_dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        self.norm_self = make_norm(norm, dim)
        self.self_attn = Attention(dim=dim, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                   causal=causal, rope=rope, bias=bias, dropout=attn_dropout)
        self.norm_cross = self.cross_attn = None
        if cross_dim is not None:
            self.norm_cross = make_norm(norm, dim)
            self.cross_attn = Attention(dim=dim, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                        kv_dim=cross_dim, bias=bias, dropout=attn_dropout)
        self.norm_mlp = make_norm(norm, dim)
        self.mlp = MLP(dim=dim, mlp_ratio=mlp_ratio, kind=mlp, dropout=dropout, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, *, key_mask: Tensor | None = None,
                context: Tensor | None = None, context_mask: Tensor | None = None,
                cache: KVCache | None = None, cross_cache: KVCache | None = None) -> Tensor:
        """Args:
            x: (b, n, c).
            key_mask: (b, m_self) bool self-attention key mask, True = real token.
            context: (b, m, cross_dim) encoder memory, for blocks with cross-attention.
            context_mask: (b, m) bool, True = real memory position.
            cache, cross_cache: per-layer KV caches for incremental decoding.

        Returns:
            (b, n, c).
        """
        x = x + self.drop(self.self_attn(self.norm_self(x), key_mask=key_mask, cache=cache))
        if self.cross_attn is not None:
            x = x + self.drop(self.cross_attn(self.norm_cross(x), context, key_mask=context_mask,
                                              cache=cross_cache))
        elif context is not None:
            raise ValueError("TransformerBlock: context given but the block has no "
                             "cross-attention; build it with cross_dim=<context width>.")
        return x + self.mlp(self.norm_mlp(x))


class TransformerStack(nn.Module):
    """``depth`` pre-norm blocks followed by a final norm; one RoPE table shared by all blocks.

    Args:
        depth: number of blocks.
        dim, num_heads, num_kv_heads, causal, cross_dim, mlp_ratio, mlp, norm, dropout,
            attn_dropout, bias: as in :class:`TransformerBlock`.
        rope: use rotary position embedding in self-attention.
        rope_base, max_len: RoPE table base and initial length (extended on demand).
    """

    def __init__(self, *, depth: int, dim: int, num_heads: int, num_kv_heads: int | None = None,
                 causal: bool = False, cross_dim: int | None = None, rope: bool = False,
                 rope_base: float = 10000.0, max_len: int = 4096, mlp_ratio: float = 4.0,
                 mlp: MlpKind = "gelu", norm: NormKind = "layernorm", dropout: float = 0.0,
                 attn_dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        if depth < 1:
            raise UserError(f"TransformerStack: depth ({depth}) must be >= 1.")
        if dim % num_heads != 0:
            raise UserError(f"TransformerStack: dim ({dim}) must be divisible by num_heads "
                            f"({num_heads}); change dim or num_heads in the model config.")
        self.dim, self.depth = dim, depth
        self.num_kv_heads = num_kv_heads or num_heads
        self.head_dim = dim // num_heads
        self.cross_dim = cross_dim
        self.rope = (RotaryEmbedding(head_dim=self.head_dim, max_len=max_len, base=rope_base)
                     if rope else None)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim=dim, num_heads=num_heads, num_kv_heads=num_kv_heads,
                             causal=causal, cross_dim=cross_dim, rope=self.rope,
                             mlp_ratio=mlp_ratio, mlp=mlp, norm=norm, dropout=dropout,
                             attn_dropout=attn_dropout, bias=bias)
            for _ in range(depth))
        self.norm = make_norm(norm, dim)

    def make_cache(self, *, batch_size: int, max_len: int, context_len: int | None = None,
                   dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                   ) -> tuple[list[KVCache], list[KVCache] | None]:
        """Per-layer self-attention caches (and cross-attention caches if ``context_len``)."""
        kw = dict(batch_size=batch_size, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                  dtype=dtype, device=device)
        caches = [KVCache(max_len=max_len, **kw) for _ in self.blocks]
        cross = None
        if context_len is not None and self.cross_dim is not None:
            cross = [KVCache(max_len=context_len, **kw) for _ in self.blocks]
        return caches, cross

    def forward(self, x: Tensor, *, key_mask: Tensor | None = None,
                context: Tensor | None = None, context_mask: Tensor | None = None,
                cache: list[KVCache] | None = None, cross_cache: list[KVCache] | None = None,
                ) -> Tensor:
        """Args:
            x: (b, n, c).
            key_mask: (b, m) bool self-attention key mask, True = real token.
            context, context_mask: encoder memory (b, m, cross_dim) and its (b, m) bool mask.
            cache, cross_cache: one KVCache per block, or None.

        Returns:
            (b, n, c), after the final norm.
        """
        for name, caches in (("cache", cache), ("cross_cache", cross_cache)):
            if caches is not None and len(caches) != self.depth:
                raise ValueError(f"TransformerStack: {name} has {len(caches)} entries but the "
                                 f"stack has depth={self.depth}; build it with make_cache().")
        for i, block in enumerate(self.blocks):
            x = block(x, key_mask=key_mask, context=context, context_mask=context_mask,
                      cache=None if cache is None else cache[i],
                      cross_cache=None if cross_cache is None else cross_cache[i])
        return self.norm(x)
