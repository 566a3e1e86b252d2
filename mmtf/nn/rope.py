"""Rotary position embedding (RoFormer, Su et al. 2021, arXiv:2104.09864).

One table per model, built in float32 from float64 angles and shared by every layer; it stays
float32 when the module is cast (``.to(torch.bfloat16)``, ``.half()``). Positions are absolute:
a cached decoding step at offset ``p`` rotates its queries and keys by ``p, p+1, ...``, so a
token-by-token pass equals a full forward pass.

Shapes: b batch, h heads, n positions, d head_dim.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from mmtf.errors import UserError
from mmtf.utils.compat import module_apply


class RotaryEmbedding(nn.Module):
    """Half-split ("GPT-NeoX") rotary embedding with a shared cos/sin table.

    Args:
        head_dim: size of each attention head; must be even.
        max_len: positions precomputed up front. Positions past it extend the table
            (doubling) on first use, so long inputs never index out of range.
        base: the wavelength base (10 000 in the paper).
    """

    def __init__(self, *, head_dim: int, max_len: int = 4096, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2 != 0:
            raise UserError(f"RotaryEmbedding: head_dim ({head_dim}) must be even; "
                            f"choose dim and num_heads so that dim // num_heads is even.")
        if max_len < 1:
            raise UserError(f"RotaryEmbedding: max_len ({max_len}) must be >= 1.")
        self.head_dim, self.base = head_dim, float(base)
        self._build(max_len)

    @property
    def max_len(self) -> int:
        return self.cos.shape[0]

    def _build(self, max_len: int, device: torch.device | None = None) -> None:
        # float64 frequencies and angles, float32 tables; built outside inference mode, since a
        # table extended while generating is later saved for backward by a training step.
        # Why: see docs/design/rope-tables.md
        with torch.inference_mode(False):
            exponent = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float64)
            inv_freq = self.base ** (-exponent / self.head_dim)                  # (d/2,)
            positions = torch.arange(max_len, device=device, dtype=torch.float64)
            angles = torch.outer(positions, inv_freq)                            # (n, d/2)
            self.register_buffer("cos", angles.cos().repeat(1, 2).float(),    # (n, d)
                                 persistent=False)
            # sin with the rotation's sign folded in, (-sin, sin): the rotation is then one
            # roll of x by d/2 instead of chunk, neg and cat. Why: see docs/design/rope-tables.md
            sin = angles.sin()
            self.register_buffer("sin", torch.cat([-sin, sin], dim=-1).float(),  # (n, d)
                                 persistent=False)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> RotaryEmbedding:
        # .to(dtype) / .half() cast the tables: rebuild them in float32 from float64 angles (a
        # cast back from bf16 would keep the bf16 rounding). Why: see docs/design/rope-tables.md
        module_apply(self, fn, recurse)
        if self.cos.dtype != torch.float32:
            self._build(self.max_len, device=self.cos.device)
        return self

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate ``x`` by absolute positions ``offset .. offset + n - 1``.

        Args:
            x: queries or keys, (b, h, n, d).
            offset: absolute position of the first of the n rows (the cache length).

        Returns:
            The rotated tensor, same shape and dtype as ``x``; the rotation runs in float32.
        """
        n = x.shape[-2]
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"RotaryEmbedding: input head_dim ({x.shape[-1]}) != table head_dim "
                             f"({self.head_dim}); build the rope with head_dim = dim // num_heads.")
        end = offset + n
        if end > self.max_len:
            new_len = self.max_len
            while new_len < end:
                new_len *= 2
            self._build(new_len, device=self.cos.device)
        cos = self.cos[offset:end]                                       # (n, d)
        sin = self.sin[offset:end]                                       # (n, d), signed
        xf = x if x.dtype == torch.float32 else x.float()
        # roll by d/2: (x1, x2) -> (x2, x1); times (-sin, sin) gives (-x2 sin, x1 sin).
        out = xf * cos + xf.roll(self.head_dim // 2, dims=-1) * sin
        return out if out.dtype == x.dtype else out.to(x.dtype)
