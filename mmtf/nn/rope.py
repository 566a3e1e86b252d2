"""Rotary position embedding (RoFormer, Su et al. 2021, arXiv:2104.09864).

One table per model, built in float32 from float64 angles and shared by every layer; it stays
float32 when the module is cast (``.to(torch.bfloat16)``, ``.half()``). Positions are absolute:
a cached decoding step at offset ``p`` rotates its queries and keys by ``p, p+1, ...``, so a
token-by-token pass equals a full forward pass.

Shapes: b batch, h heads, n positions, d head_dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

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
        base: the wavelength base (10 000 in the paper; Llama 3's rope_theta 500 000).
        scaling: None, or ``{"rope_type": "linear" | "llama3" | "dynamic", "factor": ...}``
            with llama3's ``low_freq_factor``, ``high_freq_factor`` and
            ``original_max_position_embeddings``, and dynamic's ``max_position_embeddings``
            (the trained length past which the base grows).
    """

    def __init__(self, *, head_dim: int, max_len: int = 4096, base: float = 10000.0,
                 scaling: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if head_dim % 2 != 0:
            raise UserError(f"RotaryEmbedding: head_dim ({head_dim}) must be even; "
                            f"choose dim and num_heads so that dim // num_heads is even.")
        if max_len < 1:
            raise UserError(f"RotaryEmbedding: max_len ({max_len}) must be >= 1.")
        self.head_dim, self.base = head_dim, float(base)
        self.scaling = check_scaling(scaling)
        # dynamic: the sequence length the frequencies were made for (transformers'
        # max_seq_len_cached); it only grows, until a short input resets it.
        self.trained_len = int(self.scaling.get("max_position_embeddings", 0))
        self.freq_len = self.trained_len
        self._build(max_len)

    def inv_freq(self, seq_len: int | None = None, device: torch.device | None = None,
                 ) -> Tensor:
        """The (d/2,) float64 inverse frequencies after scaling; ``seq_len``: the length a
        dynamic table is made for (default: the trained length)."""
        exponent = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float64)
        kind, s = self.scaling.get("rope_type"), self.scaling
        base = self.base
        if kind == "dynamic":
            seq_len = max(seq_len or 0, self.trained_len)
            base = base * ((s["factor"] * seq_len / self.trained_len) - (s["factor"] - 1)) ** (
                self.head_dim / (self.head_dim - 2))
        inv_freq = base ** (-exponent / self.head_dim)                           # (d/2,)
        if kind == "linear":
            inv_freq = inv_freq / s["factor"]
        elif kind == "llama3":
            inv_freq = _llama3(inv_freq, s)
        return inv_freq

    @property
    def max_len(self) -> int:
        return self.cos.shape[0]

    def _build(self, max_len: int, device: torch.device | None = None) -> None:
        # float64 frequencies and angles, float32 tables; built outside inference mode, since a
        # table extended while generating is later saved for backward by a training step.
        # Why: see docs/design/rope-tables.md
        with torch.inference_mode(False):
            inv_freq = self.inv_freq(self.freq_len, device)                      # (d/2,)
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

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Rotate ``x`` by absolute positions ``offset .. offset + n - 1`` (or ``positions``).

        Args:
            x: queries or keys, (b, h, n, d).
            offset: absolute position of the first of the n rows (the cache length).
            positions: (b, n) long, each row's own positions (left padding); every one must
                be < ``offset + n`` (a row's position never exceeds its index), so the table
                is extended from ``offset + n`` without reading the tensor.

        Returns:
            The rotated tensor, same shape and dtype as ``x``; the rotation runs in float32.
        """
        n = x.shape[-2]
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"RotaryEmbedding: input head_dim ({x.shape[-1]}) != table head_dim "
                             f"({self.head_dim}); build the rope with head_dim = dim // num_heads.")
        end = offset + n
        if self.scaling.get("rope_type") == "dynamic":
            # transformers' rule, from the longest position actually used (one host sync).
            self.follow_length(end if positions is None else int(positions.max()) + 1)
        self.reserve(end)
        if positions is None:
            cos = self.cos[offset:end]                                   # (n, d)
            sin = self.sin[offset:end]                                   # (n, d), signed
        else:
            cos = self.cos[positions][:, None]                          # (b, 1, n, d)
            sin = self.sin[positions][:, None]
        xf = x if x.dtype == torch.float32 else x.float()
        # roll by d/2: (x1, x2) -> (x2, x1); times (-sin, sin) gives (-x2 sin, x1 sin).
        out = xf * cos + xf.roll(self.head_dim // 2, dims=-1) * sin
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def reserve(self, end: int) -> None:
        """Extend the table (doubling) to hold positions ``0 .. end - 1``."""
        if end > self.max_len:
            new_len = self.max_len
            while new_len < end:
                new_len *= 2
            self._build(new_len, device=self.cos.device)

    def follow_length(self, seq_len: int) -> None:
        """Dynamic NTK scaling: new frequencies for a longer input than any before, the
        trained ones again for an input within the trained length (transformers'
        ``dynamic_frequency_update``). Keys already cached keep their rotation, as there."""
        grow = seq_len > self.freq_len
        reset = seq_len < self.trained_len and self.freq_len > self.trained_len
        if grow or reset:
            self.freq_len = seq_len if grow else self.trained_len
            self._build(self.max_len, device=self.cos.device)


ROPE_TYPES = ("default", "linear", "llama3", "dynamic")
_NEEDS = {"linear": ("factor",), "dynamic": ("factor", "max_position_embeddings"),
          "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                     "original_max_position_embeddings")}


def check_scaling(scaling: Mapping[str, Any] | None) -> dict[str, Any]:
    """``scaling`` checked ({} for none or "default"); "type" is read as "rope_type".

    Raises:
        UserError: an unknown type or a missing field, named with the supported list.
    """
    if not scaling:
        return {}
    s = dict(scaling)
    kind = s.get("rope_type", s.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise UserError(f"RotaryEmbedding: rope_scaling type {kind!r} is not supported; mmtf "
                        f"computes {', '.join(ROPE_TYPES)} (yarn and longrope are not built).")
    if kind == "default":
        return {}
    missing = [k for k in _NEEDS[kind] if s.get(k) is None]
    if missing:
        raise UserError(f"RotaryEmbedding: rope_scaling type {kind!r} needs {missing[0]}; "
                        f"add it to rope_scaling.")
    if not float(s["factor"]) >= 1.0 and kind != "linear":
        raise UserError(f"RotaryEmbedding: rope_scaling factor ({s['factor']}) must be >= 1.")
    return {"rope_type": kind, **{k: s[k] for k in _NEEDS[kind]}}


def _llama3(inv_freq: Tensor, s: Mapping[str, Any]) -> Tensor:
    """Llama 3.1's frequencies: long wavelengths divided by ``factor``, short ones kept, a
    smooth blend between (transformers' ``_compute_llama3_parameters``)."""
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(
        s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)
