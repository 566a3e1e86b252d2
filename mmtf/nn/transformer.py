"""Transformer block and stack built on the one attention core.

A pre-norm block (the default) is: x + SelfAttn(Norm(x)), [x + CrossAttn(Norm(x), context)],
x + MLP(Norm(x)); a post-norm block (``BlockOptions.postnorm``: BERT, RoBERTa, the original
transformer) normalises after each residual add instead: Norm(x + SelfAttn(x)), ... Encoders
build it with ``causal=False``, decoders with ``causal=True`` and ``cross_dim`` set. Why post-norm
is an option of the one block: docs/design/text-encoders.md.

Attention maps for inspection: ``TransformerStack.forward(..., attention_layers={"cross": [1]})``
also returns the attention probabilities of the chosen layers, taken from the attention core's
explicit softmax path (``need_weights``); every other layer stays on the fused SDPA kernel.

Shapes: b batch, h heads, n sequence length, m context (or key) length, c = dim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from mmtf.errors import UserError
from mmtf.nn.attention import Attention, projection_biases
from mmtf.nn.kv_cache import KVCache
from mmtf.nn.linear import Linear
from mmtf.nn.rope import RotaryEmbedding
from mmtf.utils.parts import as_part

NormKind = Literal["layernorm", "rmsnorm"]
# gelu: exact (erf) GELU, as Whisper, ViT, BERT; gelu_tanh: the tanh approximation (GPT-2's
# "gelu_new"); quick_gelu: x * sigmoid(1.702 x) (CLIP); swiglu: gated SiLU.
MlpKind = Literal["gelu", "gelu_tanh", "quick_gelu", "swiglu"]
MLP_KINDS: tuple[str, ...] = ("gelu", "gelu_tanh", "quick_gelu", "swiglu")
AttentionKind = Literal["self", "cross"]
# {"self": [0, -1], "cross": [1]}: which layers' attention probabilities to return.
AttentionLayers = Mapping[AttentionKind, Sequence[int]]
# {"cross": {1: (b, h, n, m)}}: the returned maps, keyed by kind then (non-negative) layer index.
AttentionMaps = dict[str, dict[int, Tensor]]


@dataclass(frozen=True)
class BlockOptions:
    """How each transformer block is built (one frozen value for all ``depth`` blocks).

    Args:
        num_kv_heads: key/value heads (grouped-query when fewer); None = ``num_heads``.
        mlp_ratio, mlp: hidden width ratio and kind (see :class:`MLP`).
        norm, norm_eps: "layernorm" or "rmsnorm", and its epsilon.
        dropout: residual and MLP dropout. attn_dropout: attention-probability dropout.
        bias: biases of the attention projections (bool or letters of "qkvo", see
            :class:`~mmtf.nn.attention.Attention`). mlp_bias: biases of the MLP's linear layers
            (default: True when any attention projection has one).
        head_dim: width of each attention head; None = ``dim // num_heads`` (Qwen3 sets it).
        qk_norm: RMSNorm (epsilon ``norm_eps``) over each head's queries and keys (Qwen3).
        mlp_hidden: the MLP's hidden width exactly (a pretrained ``intermediate_size``); None
            derives it from ``mlp_ratio``.
        postnorm: each norm after its residual add (BERT's post-LN) instead of before the
            sub-layer; a post-norm stack usually has no final norm (``final_norm=False``).
    """

    num_kv_heads: int | None = None
    mlp_ratio: float = 4.0
    mlp: MlpKind = "gelu"
    norm: NormKind = "layernorm"
    norm_eps: float = 1e-5
    dropout: float = 0.0
    attn_dropout: float = 0.0
    bias: bool | str = False
    mlp_bias: bool | None = None
    head_dim: int | None = None
    qk_norm: bool = False
    mlp_hidden: int | None = None
    postnorm: bool = False


def make_norm(kind: NormKind, dim: int, eps: float = 1e-5) -> nn.Module:
    """LayerNorm or RMSNorm of width ``dim``."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise UserError(f"norm ({kind!r}) must be 'layernorm' or 'rmsnorm'.")


class MLP(nn.Module):
    """Feed-forward layer: c -> hidden -> c with a GELU variant, or SwiGLU (Shazeer 2020,
    arXiv:2002.05202).

    Kinds: "gelu" (exact erf GELU), "gelu_tanh" (its tanh approximation, GPT-2), "quick_gelu"
    (``x * sigmoid(1.702 x)``, CLIP), "swiglu". SwiGLU uses 2/3 of the hidden width so every
    kind has the same parameter count; ``hidden`` sets the hidden width exactly instead
    (a pretrained model's ``intermediate_size``)."""

    def __init__(self, *, dim: int, mlp_ratio: float = 4.0, kind: MlpKind = "gelu",
                 dropout: float = 0.0, bias: bool = False, hidden: int | None = None) -> None:
        super().__init__()
        if kind not in MLP_KINDS:
            raise UserError(f"MLP: mlp ({kind!r}) must be one of {', '.join(MLP_KINDS)}.")
        if mlp_ratio <= 0:
            raise UserError(f"MLP: mlp_ratio ({mlp_ratio}) must be > 0.")
        if hidden is not None and hidden < 1:
            raise UserError(f"MLP: mlp_hidden ({hidden}) must be >= 1 (or null).")
        self.kind = kind
        if hidden is None:
            hidden = int(dim * mlp_ratio)
            if kind == "swiglu":
                hidden = max(1, int(2 * hidden / 3))
        if kind == "swiglu":
            self.fc_in = Linear(dim, 2 * hidden, bias=bias)
        else:
            self.fc_in = Linear(dim, hidden, bias=bias)
        self.fc_out = Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x: (b, n, c) -> (b, n, c)."""
        h = self.fc_in(x)
        if self.kind == "swiglu":
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        elif self.kind == "quick_gelu":
            h = h * torch.sigmoid(1.702 * h)
        else:
            h = F.gelu(h, approximate="tanh" if self.kind == "gelu_tanh" else "none")
        return active_dropout(self.drop, self.fc_out(h))


def active_dropout(drop: nn.Dropout, x: Tensor) -> Tensor:
    """``drop(x)``, skipped where it is the identity (eval mode or p = 0): a decode step calls
    it three times per layer, and each skipped call is one dispatched operator less."""
    return drop(x) if drop.training and drop.p > 0 else x


class TransformerBlock(nn.Module):
    """Pre-norm (or post-norm) block: self-attention, optional cross-attention, MLP, each with
    a residual.

    Args:
        dim, num_heads: width c and attention heads.
        block: the other options (:class:`BlockOptions`, or a mapping of its fields).
        causal: causal self-attention (decoders) or bidirectional (encoders).
        cross_dim: width of the cross-attention context; None = no cross-attention.
        rope: shared rotary table for self-attention, or None.
    """

    def __init__(self, *, dim: int, num_heads: int,
                 block: BlockOptions | Mapping[str, Any] | None = None, causal: bool = False,
                 cross_dim: int | None = None, rope: RotaryEmbedding | None = None) -> None:
        super().__init__()
        o = as_part(BlockOptions, block)
        mlp_bias = bool(projection_biases(o.bias)) if o.mlp_bias is None else o.mlp_bias
        heads = dict(dim=dim, num_heads=num_heads, num_kv_heads=o.num_kv_heads, bias=o.bias,
                     dropout=o.attn_dropout, head_dim=o.head_dim)
        self.norm_self = make_norm(o.norm, dim, o.norm_eps)
        self.self_attn = Attention(causal=causal, rope=rope,
                                   qk_norm=o.norm_eps if o.qk_norm else None, **heads)
        self.norm_cross = self.cross_attn = None
        if cross_dim is not None:
            self.norm_cross = make_norm(o.norm, dim, o.norm_eps)
            self.cross_attn = Attention(kv_dim=cross_dim, **heads)
        self.norm_mlp = make_norm(o.norm, dim, o.norm_eps)
        self.mlp = MLP(dim=dim, mlp_ratio=o.mlp_ratio, kind=o.mlp, dropout=o.dropout,
                       bias=mlp_bias, hidden=o.mlp_hidden)
        self.drop = nn.Dropout(o.dropout)
        self.postnorm = o.postnorm

    def forward(self, x: Tensor, *, key_mask: Tensor | None = None,
                context: Tensor | None = None, context_mask: Tensor | None = None,
                cache: KVCache | None = None, cross_cache: KVCache | None = None,
                need_weights: frozenset[AttentionKind] = frozenset(),
                positions: Tensor | None = None,
                ) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """Args:
            x: (b, n, c).
            key_mask: (b, m_self) bool self-attention key mask, True = real token.
            positions: (b, n) long RoPE positions per row (left padding), or None.
            context, context_mask: encoder memory (b, m, cross_dim) and its (b, m) bool mask.
            cache, cross_cache: per-layer KV caches for incremental decoding.
            need_weights: attentions ("self", "cross") whose probabilities to return (on the
                explicit softmax path).

        Returns:
            (b, n, c); with ``need_weights`` also ``{kind: (b, h, n, m)}`` for each kind asked.
        """
        weights: dict[str, Tensor] = {}
        post = self.postnorm                  # pre-norm: norm each input; post-norm: each sum
        out = self.self_attn(x if post else self.norm_self(x), key_mask=key_mask, cache=cache,
                             need_weights="self" in need_weights, positions=positions)
        if "self" in need_weights:
            out, weights["self"] = out
        x = x + active_dropout(self.drop, out)
        if post:
            x = self.norm_self(x)
        if self.cross_attn is not None:
            out = self.cross_attn(x if post else self.norm_cross(x), context,
                                  key_mask=context_mask, cache=cross_cache,
                                  need_weights="cross" in need_weights)
            if "cross" in need_weights:
                out, weights["cross"] = out
            x = x + active_dropout(self.drop, out)
            if post:
                x = self.norm_cross(x)
        elif context is not None:
            raise ValueError("TransformerBlock: context given but the block has no "
                             "cross-attention; build it with cross_dim=<context width>.")
        x = self.norm_mlp(x + self.mlp(x)) if post else x + self.mlp(self.norm_mlp(x))
        return (x, weights) if need_weights else x


class TransformerStack(nn.Module):
    """``depth`` blocks followed by a final norm; one RoPE table shared by all blocks.

    Args:
        depth, dim, num_heads, block, causal, cross_dim: blocks; as :class:`TransformerBlock`.
        rope: use rotary position embedding in self-attention (False: the caller adds
            absolute positions, see :mod:`mmtf.nn.positions`).
        rope_base, max_len: RoPE table base and initial length (extended on demand).
        rope_scaling: RoPE frequency scaling (:class:`~mmtf.nn.rope.RotaryEmbedding`), or None.
        final_norm: end with a norm; False where the output is read before it (CLIP's tower).
        activation_checkpointing: recompute each block in backward (non-reentrant: same RNG,
            same gradients), only where autograd records; parameter names do not change.
            Why: docs/design/activation-checkpointing.md.
    """

    def __init__(self, *, depth: int, dim: int, num_heads: int,
                 block: BlockOptions | Mapping[str, Any] | None = None, causal: bool = False,
                 cross_dim: int | None = None, rope: bool = False, rope_base: float = 10000.0,
                 max_len: int = 4096, final_norm: bool = True,
                 activation_checkpointing: bool = False,
                 rope_scaling: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        block = as_part(BlockOptions, block)
        if depth < 1:
            raise UserError(f"TransformerStack: depth ({depth}) must be >= 1.")
        if not 0.0 <= block.dropout < 1.0:
            raise UserError(f"TransformerStack: dropout ({block.dropout}) must be in [0, 1).")
        self.dim, self.depth = dim, depth
        self.activation_checkpointing = bool(activation_checkpointing)
        # Before head_dim is derived below: the width rule belongs to Attention.
        self.num_kv_heads = Attention.check_sizes(dim=dim, num_heads=num_heads,
                                                  num_kv_heads=block.num_kv_heads,
                                                  head_dim=block.head_dim)
        self.head_dim = dim // num_heads if block.head_dim is None else block.head_dim
        self.cross_dim = cross_dim
        self.rope = (RotaryEmbedding(head_dim=self.head_dim, max_len=max_len, base=rope_base,
                                     scaling=rope_scaling) if rope else None)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim=dim, num_heads=num_heads, block=block, causal=causal,
                             cross_dim=cross_dim, rope=self.rope)
            for _ in range(depth))
        self.norm = make_norm(block.norm, dim, block.norm_eps) if final_norm else nn.Identity()

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
                attention_layers: AttentionLayers | None = None,
                positions: Tensor | None = None,
                ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """Args:
            x: (b, n, c).
            key_mask: (b, m) bool self-attention key mask, True = real token.
            positions: (b, n) long RoPE positions of each row (left padding); None = the
                cache length + 0 .. n - 1 for every row.
            context, context_mask: encoder memory (b, m, cross_dim) and its (b, m) bool mask.
            cache, cross_cache: one KVCache per block, or None.
            attention_layers: ``{"self": [layers], "cross": [layers]}`` (indices from 0,
                negative counts from the end) whose attention probabilities to return; None
                returns the output alone.

        Returns:
            (b, n, c), after the final norm if any; with ``attention_layers`` also
            ``{kind: {layer: (b, h, n, m)}}`` of the layers asked for (masked keys are 0).
        """
        for name, caches in (("cache", cache), ("cross_cache", cross_cache)):
            if caches is not None and len(caches) != self.depth:
                raise ValueError(f"TransformerStack: {name} has {len(caches)} entries but the "
                                 f"stack has depth={self.depth}; build it with make_cache().")
        wanted = self.attention_request(attention_layers)
        maps: AttentionMaps = {kind: {} for kind in (attention_layers or {})}
        # A recomputation would write a cache twice and has no maps to return: plain there.
        recompute = (self.activation_checkpointing and torch.is_grad_enabled() and cache is None
                     and cross_cache is None and attention_layers is None)
        for i, block in enumerate(self.blocks):
            if recompute:
                x = checkpoint(block, x, use_reentrant=False, key_mask=key_mask,
                               context=context, context_mask=context_mask, positions=positions)
                continue
            out = block(x, key_mask=key_mask, context=context, context_mask=context_mask,
                        cache=None if cache is None else cache[i],
                        cross_cache=None if cross_cache is None else cross_cache[i],
                        need_weights=wanted[i], positions=positions)
            if wanted[i]:
                out, weights = out
                for kind, w in weights.items():
                    maps[kind][i] = w
            x = out
        x = self.norm(x)
        return x if attention_layers is None else (x, maps)

    def attention_request(self, attention_layers: AttentionLayers | None,
                          ) -> list[frozenset[AttentionKind]]:
        """Per block, the attention kinds whose weights ``attention_layers`` asks for.

        Raises:
            UserError: an unknown kind, a layer index outside ``[-depth, depth)`` or "cross" on
                a stack without cross-attention; the message names the value and the range.
        """
        wanted: list[set[AttentionKind]] = [set() for _ in range(self.depth)]
        for kind, layers in (attention_layers or {}).items():
            if kind not in ("self", "cross"):
                raise UserError(f"attention_layers: kind {kind!r} must be 'self' or 'cross'.")
            if kind == "cross" and self.cross_dim is None:
                raise UserError("attention_layers: 'cross' asked of a stack without "
                                "cross-attention (an encoder); ask for 'self' layers only.")
            for layer in layers:
                if not -self.depth <= int(layer) < self.depth:
                    raise UserError(f"attention_layers: {kind} layer {layer} is outside "
                                    f"[{-self.depth}, {self.depth}) for a stack of depth "
                                    f"{self.depth}; pick layers 0..{self.depth - 1} (or -1 = last).")
                wanted[int(layer) % self.depth].add(kind)
        return [frozenset(w) for w in wanted]
