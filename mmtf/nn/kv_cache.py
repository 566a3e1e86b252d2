"""Static key/value cache for incremental decoding.

Buffers are preallocated to ``max_len`` and written in place (self-attention: grows per step;
cross-attention: filled once). A plain object, not an ``nn.Module``, so ``torch.compile`` treats
``length`` as symbolic: one compiled step serves every position (:mod:`mmtf.decoders.compiled`).

Shapes: b batch (or batch * beams), g kv heads, m cached positions, d head_dim."""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Preallocated keys and values of one attention layer.

    Args:
        batch_size: rows of the batch (batch * beams for beam search).
        num_kv_heads, head_dim: g and d of the layer.
        max_len: positions the cache can hold; writing past it raises.
        dtype, device: of the buffers; match the model's activations.
    """

    def __init__(self, *, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 ) -> None:
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads),
                            ("max_len", max_len), ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"KVCache: {name} ({value}) must be >= 1.")
        # One spare position: a view of the cached positions is then never the whole buffer, so
        # its contiguity does not change at the last position (torch.compile would otherwise
        # specialise on it and compile the decode step once more for that one step).
        shape = (batch_size, num_kv_heads, max_len + 1, head_dim)
        self._max_len = max_len
        # empty, not zeros: only the first `length` positions are ever read, and zero-filling
        # max_len positions per layer cost ~24 ms per generate() call at decoder-base size.
        self.k = torch.empty(shape, dtype=dtype, device=device)             # (b, g, max_len + 1, d)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def batch_size(self) -> int:
        return self.k.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self._max_len

    @property
    def head_dim(self) -> int:
        return self.k.shape[3]

    def reset(self) -> None:
        """Forget the cached positions (the buffers are reused, not freed)."""
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write new keys/values (b, g, n, d) after the cached ones; return views of all cached
        keys and values including the new ones, (b, g, m + n, d).

        Raises:
            ValueError: if the shapes do not match the cache or it would overflow ``max_len``.
        """
        b, g, n, d = k.shape
        if (b, g, d) != (self.batch_size, self.num_kv_heads, self.head_dim):
            raise ValueError(
                f"KVCache: got keys of shape (batch={b}, kv_heads={g}, head_dim={d}) but the cache "
                f"was built for (batch={self.batch_size}, kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}); build one cache per layer with the layer's sizes.")
        end = self.length + n
        if end > self.max_len:
            raise ValueError(
                f"KVCache: cache is full ({self.length} + {n} tokens > max_len={self.max_len}); "
                f"call reset() or build the cache with a larger max_len.")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.keys, self.values

    @property
    def keys(self) -> Tensor:
        """Cached keys, (b, g, m, d)."""
        return self.k[:, :, : self.length]

    @property
    def values(self) -> Tensor:
        """Cached values, (b, g, m, d)."""
        return self.v[:, :, : self.length]

    @torch.no_grad()
    def reorder(self, index: Tensor) -> None:
        """Gather batch rows in place, e.g. to follow surviving beams.

        Args:
            index: (b,) long tensor; row i of the new cache is row ``index[i]`` of the old one.
        """
        if index.shape != (self.batch_size,):
            raise ValueError(f"KVCache.reorder: index shape {tuple(index.shape)} != "
                             f"({self.batch_size},); pass one source row per cache row.")
        index = index.to(self.k.device)
        m = self.length
        self.k[:, :, :m] = self.k[:, :, :m].index_select(0, index)
        self.v[:, :, :m] = self.v[:, :, :m].index_select(0, index)
