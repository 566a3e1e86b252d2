"""Multi-head attention shared by every mmtf encoder and decoder: the one attention core.

One class for bidirectional self-attention (``causal=False``), causal self-attention with RoPE
and a KV cache (``causal=True``) and cross-attention (``kv_dim``, called with ``context``);
``num_kv_heads`` gives grouped-query (1: multi-query) attention. The default path is
``scaled_dot_product_attention``; the explicit softmax path runs only for ``need_weights=True``.
Under ``torch.compile`` a single query goes through :func:`single_query_attention`.

Masking: ``key_mask`` is bool, True = a real key. Causal masks are bottom-right aligned (query
``i`` after ``p`` cached positions sees keys ``0 .. p + i``; SDPA's top-left ``is_causal`` is
used only when the block starts at 0). A fully masked query returns zeros, never NaN.

Shapes: b batch, h query heads, g kv heads, n query len, m key len, c = dim, d = head_dim."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from mmtf.errors import UserError
from mmtf.nn.kv_cache import KVCache
from mmtf.nn.linear import Linear
from mmtf.nn.rope import RotaryEmbedding


class Attention(nn.Module):
    """Multi-head (grouped-query) attention with optional RoPE, KV cache and cross-attention.

    Args:
        dim: model width c of the queries and of the output.
        num_heads: query heads h; ``dim`` must be divisible by it.
        num_kv_heads: key/value heads g (default ``num_heads``); must divide ``num_heads``.
        causal: mask future keys (decoder self-attention). The role sets it, not the config.
        rope: shared rotary table applied to queries and keys of self-attention.
        kv_dim: width of the ``context``; set, the layer is cross-attention and must be called
            with ``context``, unset it rejects one.
        bias: True (all projections), False (none) or the letters of the biased ones among
            "qkvo" (Whisper: "qvo"; softmax cancels a key bias).
        dropout: attention-probability dropout, active in training only.
        head_dim: width d of each head; None = ``dim // num_heads``. Set (Qwen3: 128 at
            dim 1024 with 16 heads), queries and values are ``num_heads * head_dim`` wide.
        qk_norm: RMSNorm over each head's queries and keys before RoPE (Qwen3), with this
            epsilon; None = none.
    """

    def __init__(self, *, dim: int, num_heads: int, num_kv_heads: int | None = None,
                 causal: bool = False, rope: RotaryEmbedding | None = None,
                 kv_dim: int | None = None, bias: bool | str = False, dropout: float = 0.0,
                 head_dim: int | None = None, qk_norm: float | None = None) -> None:
        super().__init__()
        biased = projection_biases(bias)
        num_kv_heads = self.check_sizes(dim=dim, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                        head_dim=head_dim)
        if kv_dim is not None and causal:
            raise UserError("Attention: causal=True with kv_dim set; cross-attention keys are the "
                            "encoder memory and have no causal order. Build it with causal=False.")
        if kv_dim is not None and rope is not None:
            raise UserError("Attention: rope with kv_dim set; RoPE applies to self-attention only. "
                            "Build the cross-attention layer with rope=None.")
        if not 0.0 <= dropout < 1.0:
            raise UserError(f"Attention: dropout ({dropout}) must be in [0, 1).")
        self.dim, self.num_heads, self.num_kv_heads = dim, num_heads, num_kv_heads
        self.head_dim = dim // num_heads if head_dim is None else head_dim
        if rope is not None and rope.head_dim != self.head_dim:
            raise UserError(f"Attention: rope.head_dim ({rope.head_dim}) != dim // num_heads "
                            f"({self.head_dim}); build RotaryEmbedding(head_dim={self.head_dim}).")
        self.causal, self.rope, self.kv_dim, self.dropout = causal, rope, kv_dim, dropout
        self.is_cross = kv_dim is not None
        kv_width = num_kv_heads * self.head_dim
        inner = num_heads * self.head_dim
        self.to_q = Linear(dim, inner, bias="q" in biased)
        # Keys and values share one GEMM; a bias on only one of them is a separate vector.
        fused_bias = {"k", "v"} <= biased
        self.to_kv = Linear(kv_dim or dim, 2 * kv_width, bias=fused_bias)
        self.k_bias = self.v_bias = None
        if not fused_bias and "k" in biased:
            self.k_bias = nn.Parameter(torch.zeros(kv_width))
        if not fused_bias and "v" in biased:
            self.v_bias = nn.Parameter(torch.zeros(kv_width))
        self.to_out = Linear(inner, dim, bias="o" in biased)
        self.q_norm = self.k_norm = None
        if qk_norm is not None:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=qk_norm)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=qk_norm)

    def extra_repr(self) -> str:
        kind = "cross" if self.is_cross else ("causal" if self.causal else "bidirectional")
        return (f"{kind}, heads={self.num_heads}, kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, rope={self.rope is not None}")

    def project_kv(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``source`` (b, m, c_kv), each (b, g, m, d)."""
        # chunk, not one "(two g d)" rearrange: unpacking a stacked view makes autograd stack
        # the two gradients and copy them back strided. Why: see docs/design/attention-core.md
        k, v = self.to_kv(source).chunk(2, dim=-1)                         # (b, m, g d) each
        if self.k_bias is not None:
            k = k + self.k_bias
        if self.v_bias is not None:
            v = v + self.v_bias
        return (rearrange(k, "b m (g d) -> b g m d", g=self.num_kv_heads),
                rearrange(v, "b m (g d) -> b g m d", g=self.num_kv_heads))


    @staticmethod
    def check_sizes(*, dim: int, num_heads: int, num_kv_heads: int | None = None,
                    head_dim: int | None = None) -> int:
        """Check the width rules of multi-head attention once for every caller (stacks call it
        before deriving ``head_dim``) and return ``num_kv_heads`` (None -> ``num_heads``).

        Raises:
            UserError: a size < 1, ``dim`` not divisible by ``num_heads``, or ``num_heads`` not a
                multiple of ``num_kv_heads``.
        """
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if dim < 1 or num_heads < 1 or num_kv_heads < 1:
            raise UserError(f"Attention: dim ({dim}), num_heads ({num_heads}) and num_kv_heads "
                            f"({num_kv_heads}) must all be >= 1.")
        if head_dim is not None and head_dim < 1:
            raise UserError(f"Attention: head_dim ({head_dim}) must be >= 1 (or null: dim // "
                            f"num_heads).")
        if head_dim is None and dim % num_heads != 0:
            raise UserError(f"Attention: dim ({dim}) must be divisible by num_heads ({num_heads}); "
                            f"change dim or num_heads.")
        if num_heads % num_kv_heads != 0:
            raise UserError(f"Attention: num_heads ({num_heads}) must be a multiple of "
                            f"num_kv_heads ({num_kv_heads}); use num_kv_heads=1 for multi-query "
                            f"attention or num_kv_heads=num_heads for plain multi-head.")
        return num_kv_heads

    def forward(self, x: Tensor, context: Tensor | None = None, *, key_mask: Tensor | None = None,
                cache: KVCache | None = None, need_weights: bool = False,
                positions: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``x`` to itself (self-attention) or to ``context`` (cross-attention).

        Args:
            x: queries, (b, n, c).
            context: cross-attention source, (b, m, kv_dim); None reuses a filled cache.
            key_mask: (b, m) bool, True = a real key (cached self-attention: m = cached + new).
            cache: self-attention appends the new K/V; cross-attention fills it once.
            need_weights: also return the attention probabilities (explicit softmax path).
            positions: (b, n) long RoPE positions of each row's new tokens (left padding);
                None = ``cache length + 0 .. n - 1`` for every row.

        Returns:
            (b, n, c), and with ``need_weights`` also the weights (b, h, n, m).
        """
        self._check_inputs(x, context, cache)
        q = rearrange(self.to_q(x), "b n (h d) -> b h n d", h=self.num_heads)
        offset = 0
        if self.is_cross:
            if cache is not None and cache.length > 0:
                k, v = cache.keys, cache.values                            # projected once
            else:
                k, v = self.project_kv(context)
                if cache is not None:
                    k, v = cache.append(k, v)
        else:
            k, v = self.project_kv(x)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)                     # per head, before RoPE
            if cache is not None:
                offset = cache.length
            if self.rope is not None:                                     # rotate before caching
                q, k = self.rope(q, offset, positions), self.rope(k, offset, positions)
            if cache is not None:
                k, v = cache.append(k, v)                                 # (b, g, offset + n, d)
        n, m = q.shape[-2], k.shape[-2]
        if key_mask is not None:
            self._check_mask(key_mask, q.shape[0], m)

        if need_weights:
            out, weights = self._explicit(q, k, v, self._mask(n, m, offset, key_mask, q.device))
            return self.to_out(rearrange(out, "b h n d -> b n (h d)")), weights

        dropout_p = self.dropout if self.training else 0.0
        gqa = self.num_kv_heads != self.num_heads
        if n == 1 and dropout_p == 0.0 and torch.compiler.is_compiling():
            out = single_query_attention(q, k, v, key_mask)               # (b, h, 1, d)
        elif key_mask is None and (not self.causal or offset == 0 or n == 1):
            # No mask tensor: is_causal covers a block that starts at position 0 (then n == m);
            # a single new token may see every cached key.
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=self.causal and n > 1, dropout_p=dropout_p, enable_gqa=gqa)
        else:
            mask = self._mask(n, m, offset, key_mask, q.device)          # (b|1, 1, n, m)
            mask, row_has_key = _guard_empty_rows(mask)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                 enable_gqa=gqa)
            if row_has_key is not None:
                out = out.masked_fill(~row_has_key, 0.0)
        return self.to_out(rearrange(out, "b h n d -> b n (h d)"))

    def _mask(self, n: int, m: int, offset: int, key_mask: Tensor | None,
              device: torch.device) -> Tensor | None:
        """Bool mask, True = attend: (1, 1, n, m) causal, (b, 1, 1, m) padding, or both."""
        mask = None
        if self.causal:
            # Bottom-right aligned: query i (absolute position offset + i) sees keys 0..offset+i.
            mask = torch.ones(n, m, dtype=torch.bool, device=device).tril(m - n)
            mask = rearrange(mask, "n m -> 1 1 n m")
        if key_mask is not None:
            pad = rearrange(key_mask, "b m -> b 1 1 m")
            mask = pad if mask is None else mask & pad                   # (b, 1, n, m)
        return mask

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                  ) -> tuple[Tensor, Tensor]:
        """Reference softmax path that also returns the weights (b, h, n, m) in the dtype of q.

        Scores and softmax run in at least float32 (float64 stays float64), and q is scaled
        before the matmul, as in SDPA: unscaled float16 scores overflow from |q.k| > 65504."""
        r = self.num_heads // self.num_kv_heads
        k, v = (t.repeat_interleave(r, dim=1) for t in (k, v))           # (b, h, m, d)
        acc = torch.promote_types(q.dtype, torch.float32)
        scores = (q.to(acc) * self.head_dim ** -0.5) @ k.to(acc).transpose(-2, -1)  # (b, h, n, m)
        row_has_key = None
        if mask is not None:
            mask, row_has_key = _guard_empty_rows(mask)
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        if row_has_key is not None:
            weights = weights.masked_fill(~row_has_key, 0.0)
        weights = weights.to(q.dtype)
        attn = F.dropout(weights, p=self.dropout, training=self.training)
        return attn @ v, weights                                          # (b, h, n, d)

    def _check_inputs(self, x: Tensor, context: Tensor | None, cache: KVCache | None) -> None:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"Attention: x must be (batch, length, dim={self.dim}); "
                             f"got shape {tuple(x.shape)}.")
        if self.is_cross:
            if context is None and (cache is None or cache.length == 0):
                raise ValueError("Attention: this is a cross-attention layer (built with kv_dim); "
                                 "pass context=encoder memory (or a filled cross-attention cache).")
            if context is not None and (context.dim() != 3 or context.shape[-1] != self.kv_dim
                                        or context.shape[0] != x.shape[0]):
                raise ValueError(f"Attention: context must be (batch={x.shape[0]}, length, "
                                 f"kv_dim={self.kv_dim}); got shape {tuple(context.shape)}.")
        elif context is not None:
            raise ValueError("Attention: context given to a self-attention layer; build the layer "
                             "with kv_dim=<context width> to use it for cross-attention.")
        if cache is not None and cache.num_kv_heads != self.num_kv_heads:
            raise ValueError(f"Attention: cache has {cache.num_kv_heads} kv heads but the layer has "
                             f"num_kv_heads={self.num_kv_heads}; build the cache from the layer.")

    @staticmethod
    def _check_mask(key_mask: Tensor, b: int, m: int) -> None:
        if key_mask.dtype != torch.bool:
            raise ValueError(f"Attention: key_mask must be a bool tensor (True = a real key), got "
                             f"dtype {key_mask.dtype}; convert with key_mask.bool() or lengths "
                             f"-> arange(m) < lengths[:, None].")
        if tuple(key_mask.shape) != (b, m):
            raise ValueError(f"Attention: key_mask shape {tuple(key_mask.shape)} != (batch={b}, "
                             f"keys={m}); with a cache the mask covers cached plus new keys.")


def projection_biases(bias: bool | str) -> frozenset[str]:
    """Which projections of :class:`Attention` have a bias: True -> all of "qkvo", False -> none,
    or the letters of a string such as "qvo".

    Raises:
        UserError: a string with letters other than q, k, v, o.
    """
    if isinstance(bias, bool):
        return frozenset("qkvo" if bias else "")
    letters = frozenset(str(bias))
    if not letters <= frozenset("qkvo"):
        raise UserError(f"Attention: bias ({bias!r}) must be true, false or a string of the "
                        f"projections that have a bias, from 'q', 'k', 'v', 'o' (e.g. 'qvo').")
    return letters


def single_query_attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None,
                           ) -> Tensor:
    """Softmax attention of a single query position, as plain reductions.

    Equals ``scaled_dot_product_attention`` (zeros for fully masked rows). Compiled, it fuses
    into one pass over K and V; eagerly it would materialise (b, g, r, m, d) products, so it is
    called only while compiling (docs/design/attention-core.md).

    Args:
        q: (b, h, 1, d) queries.
        k, v: (b, g, m, d) keys and values; g divides h (grouped-query heads).
        key_mask: (b, m) bool, True = a real key, or None.

    Returns (b, h, 1, d) in the dtype of ``q``; scores and softmax run in at least float32.
    """
    b, h, _, d = q.shape
    g = k.shape[1]
    q = rearrange(q, "b (g r) 1 d -> b g r 1 d", g=g)
    acc = torch.promote_types(q.dtype, torch.float32)          # bf16/fp16 accumulate in fp32
    scores = (q * k[:, :, None]).sum(-1, dtype=acc) * d ** -0.5          # (b, g, r, m)
    if key_mask is not None:
        scores = scores.masked_fill(~rearrange(key_mask, "b m -> b 1 1 m"), -math.inf)
    weights = scores.softmax(dim=-1)
    if key_mask is not None:
        weights = weights.nan_to_num(0.0)                 # all keys masked: 0/0 -> zeros
    out = (weights[..., None] * v[:, :, None]).sum(-2)                      # (b, g, r, d)
    return rearrange(out.to(q.dtype), "b g r d -> b (g r) 1 d")


def _guard_empty_rows(mask: Tensor) -> tuple[Tensor, Tensor | None]:
    """Let fully masked query rows attend everywhere (finite softmax, finite gradients) and
    report them so the caller zeroes their output."""
    row_has_key = mask.any(dim=-1, keepdim=True)                          # (b|1, 1, n, 1)
    if bool(row_has_key.all()):
        return mask, None
    return mask | ~row_has_key, row_has_key
