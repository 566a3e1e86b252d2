"""Autoregressive text decoder with cross-attention to an encoder memory.

Token embedding -> pre-norm blocks (:class:`mmtf.nn.TransformerStack`: causal self-attention,
cross-attention, MLP) -> final norm -> LM head, tied to the embedding by default (Press & Wolf
2017). Positions: RoPE (``rope``) or a learned table (``learned``: GPT-2, Whisper); ``max_len``
bounds them and longer inputs raise.

``decoder(tokens, memory, memory_mask)`` runs all positions at once (teacher forcing);
``decoder.step(tokens, cache, memory=...)`` one new token at a time on a static K/V cache
(:meth:`make_cache`), cross-attention K/V projected on the first step and reused.

Shapes: b batch (or batch * beams), n target length, m memory length, c = dim,
c_ctx = context_dim, v = vocab_size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from mmtf.errors import UserError, in_config
from mmtf.nn import KVCache, TransformerStack
from mmtf.nn.linear import Linear
from mmtf.nn.positions import LearnedPositions
from mmtf.nn.transformer import AttentionLayers, AttentionMaps, BlockOptions
from mmtf.utils.parts import as_part

PositionKind = Literal["rope", "learned"]


@dataclass
class DecoderCache:
    """Static per-generation state of a :class:`TextDecoder`, built by ``make_cache``.

    Attributes:
        self_caches: one self-attention KVCache per block, holding (b, g, max_len, d) each.
        cross_caches: one cross-attention KVCache per block, holding (b, g, m, d) each; filled
            from the memory by the first ``step`` and read-only afterwards.
        memory_mask: (b, m) bool, True = real memory position, or None when every position is
            real (then no mask is built in the attention at all). Set by the first ``step``.
    """

    self_caches: list[KVCache]
    cross_caches: list[KVCache]
    memory_mask: Tensor | None = None

    @property
    def length(self) -> int:
        """Target positions already cached."""
        return self.self_caches[0].length

    @property
    def max_len(self) -> int:
        return self.self_caches[0].max_len

    @property
    def filled(self) -> bool:
        """Whether the cross-attention K/V have been projected from the memory."""
        return self.cross_caches[0].length > 0

    def reorder(self, index: Tensor) -> None:
        """Follow surviving beams: row i becomes row ``index[i]`` of the self-attention caches.

        The cross-attention caches are left alone: beam search expands the memory to
        ``batch * beams`` rows before the first step and ``index`` only ever picks rows among the
        beams of the same batch item, whose memory rows (and so cross K/V rows) are identical.
        """
        for cache in self.self_caches:
            cache.reorder(index)

    def reset(self) -> None:
        """Forget all positions and the memory; the buffers are reused."""
        for cache in (*self.self_caches, *self.cross_caches):
            cache.reset()
        self.memory_mask = None


class TextDecoder(nn.Module):
    """Causal transformer decoder over token ids, cross-attending to an encoder memory.

    Args:
        vocab_size: token ids are in ``[0, vocab_size)``.
        dim, depth, num_heads, block, activation_checkpointing: as
            :class:`mmtf.nn.TransformerStack` (``block.dropout`` also after the embedding).
        context_dim: width of the encoder memory (the encoder's ``dim``).
        max_len: most positions a forward pass or cache may hold (the learned table's size).
        tie_embeddings: share the LM head weight with the token embedding.
        pad_id: the padding token's id (carried for callers).
        positions: "rope" or "learned". rope_base: RoPE wavelength base.
    """

    def __init__(self, *, vocab_size: int, dim: int, depth: int, num_heads: int,
                 block: BlockOptions | Mapping[str, Any] | None = None, context_dim: int,
                 max_len: int = 256, tie_embeddings: bool = True, pad_id: int = 0,
                 positions: PositionKind = "rope", rope_base: float = 10000.0,
                 activation_checkpointing: bool = False) -> None:
        super().__init__()
        block = as_part(BlockOptions, block)
        # depth, num_heads and the width rules are the stack's and Attention's (in_config below).
        for name, value in (("vocab_size", vocab_size), ("dim", dim), ("context_dim", context_dim),
                            ("max_len", max_len)):
            if value < 1:
                raise UserError(f"TextDecoder: {name} ({value}) must be >= 1; "
                                f"check model.decoder.{name} in your config.")
        if not 0 <= pad_id < vocab_size:
            raise UserError(f"TextDecoder: pad_id ({pad_id}) must be in [0, vocab_size="
                            f"{vocab_size}); set model.decoder.pad_id to the tokenizer's pad id.")
        self.vocab_size, self.dim, self.depth = vocab_size, dim, depth
        self.context_dim, self.max_len, self.pad_id = context_dim, max_len, pad_id
        if positions not in ("rope", "learned"):
            raise UserError(f"TextDecoder: positions ({positions!r}) must be 'rope' or "
                            f"'learned'; fix model.decoder.positions.")
        self.tie_embeddings = tie_embeddings
        self.embed = nn.Embedding(vocab_size, dim)
        self.positions = LearnedPositions(max_len, dim) if positions == "learned" else None
        with in_config("model.decoder"):
            self.stack = TransformerStack(
                depth=depth, dim=dim, num_heads=num_heads, block=block, causal=True,
                cross_dim=context_dim, rope=positions == "rope", rope_base=rope_base,
                max_len=max_len, activation_checkpointing=activation_checkpointing)
        self.drop = nn.Dropout(block.dropout)    # after the stack: it checks dropout
        self.lm_head = Linear(dim, vocab_size, bias=False)
        # Unit-variance embeddings would make tied logits ~sqrt(dim) large; GPT-2's 0.02 keeps
        # the initial next-token distribution near uniform.
        nn.init.normal_(self.embed.weight, std=0.02)
        if tie_embeddings:
            self.lm_head.weight = self.embed.weight
        else:
            nn.init.normal_(self.lm_head.weight, std=0.02)

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, context_dim={self.context_dim}, "
                f"max_len={self.max_len}, tie_embeddings={self.tie_embeddings}")

    def forward(self, tokens: Tensor, memory: Tensor, memory_mask: Tensor | None = None, *,
                attention_layers: AttentionLayers | None = None,
                ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """Logits for every position at once (teacher forcing; no cache).

        Args:
            tokens: (b, n) long, [bos, w1, ...]; right padding needs no mask (causal attention
                never lets a real token see the pads after it).
            memory: encoder output, (b, m, c_ctx).
            memory_mask: (b, m) bool, True = real memory position; None = all real.
            attention_layers: ``{"self": [..], "cross": [..]}`` layers whose attention
                probabilities to return (:meth:`mmtf.nn.TransformerStack.forward`).

        Returns:
            Logits, (b, n, v); with ``attention_layers`` also ``{kind: {layer: (b, h, n, k)}}``,
            k = n for "self" and m for "cross".

        Raises:
            ValueError: if n > max_len or the memory width is not ``context_dim``.
        """
        self._check(tokens, 0, self.max_len, memory)
        x = self.drop(self.embed_tokens(tokens, offset=0))               # (b, n, c)
        if attention_layers is None:
            x = self.stack(x, context=memory, context_mask=memory_mask)
            return self.lm_head(x)                                       # (b, n, v)
        x, maps = self.stack(x, context=memory, context_mask=memory_mask,
                             attention_layers=attention_layers)
        return self.lm_head(x), maps

    def embed_tokens(self, tokens: Tensor, *, offset: int) -> Tensor:
        """Token embeddings (b, n) -> (b, n, c), plus the learned positions ``offset ..`` when
        the decoder has them."""
        x = self.embed(tokens)
        if self.positions is not None:
            x = x + self.positions(tokens.shape[1], offset)
        return x

    def make_cache(self, *, batch_size: int, context_len: int, max_len: int | None = None,
                   dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                   ) -> DecoderCache:
        """Preallocate the self- and cross-attention caches for one generation.

        Args:
            batch_size: rows b (batch * beams for beam search).
            context_len: memory length m.
            max_len: target positions to hold (default and upper bound: ``self.max_len``).
            dtype, device: of the buffers; default: those of the parameters.
        """
        max_len = self.max_len if max_len is None else max_len
        if not 1 <= max_len <= self.max_len:
            raise UserError(f"TextDecoder: cache max_len ({max_len}) must be in [1, "
                            f"model.decoder.max_len={self.max_len}]; raise "
                            f"model.decoder.max_len or generate fewer tokens.")
        weight = self.embed.weight
        self_caches, cross_caches = self.stack.make_cache(
            batch_size=batch_size, max_len=max_len, context_len=context_len,
            dtype=dtype or weight.dtype, device=device or weight.device)
        return DecoderCache(self_caches=self_caches, cross_caches=cross_caches)

    def step(self, tokens: Tensor, cache: DecoderCache, *, memory: Tensor | None = None,
             memory_mask: Tensor | None = None) -> Tensor:
        """Decode new positions on top of the cache (usually one token per row).

        Args:
            tokens: (b, n) long, the next n tokens of every row (n = 1 when generating).
            cache: from :meth:`make_cache`; advanced by n positions in place.
            memory: (b, m, c_ctx); required on the first step (it fills the cross-attention
                cache), ignored afterwards.
            memory_mask: (b, m) bool or None (all real); read on the first step only and kept
                in the cache.

        Returns:
            Logits of the new positions, (b, n, v).
        """
        if not cache.filled:
            if memory is None:
                raise ValueError("TextDecoder.step: the first step needs memory=<encoder "
                                 "output> to fill the cross-attention cache.")
            self._check(tokens, cache.length, cache.max_len, memory)
            cache.memory_mask = memory_mask
        else:
            memory = None                              # the cross K/V are already cached
            self._check(tokens, cache.length, cache.max_len, None)
        x = self.embed_tokens(tokens, offset=cache.length)               # (b, n, c)
        x = self.stack(x, context=memory, context_mask=cache.memory_mask,
                       cache=cache.self_caches, cross_cache=cache.cross_caches)
        return self.lm_head(x)                                           # (b, n, v)

    def _check(self, tokens: Tensor, offset: int, max_len: int, memory: Tensor | None) -> None:
        if tokens.dim() != 2:
            raise ValueError(f"TextDecoder: tokens must be (batch, length) ids; got shape "
                             f"{tuple(tokens.shape)}.")
        if offset + tokens.shape[1] > max_len:
            raise UserError(f"TextDecoder: {offset} + {tokens.shape[1]} target positions exceed "
                            f"max_len={max_len}; truncate the targets (tokenizer max length) "
                            f"or raise model.decoder.max_len.")
        if memory is not None and (memory.dim() != 3 or memory.shape[-1] != self.context_dim):
            raise UserError(f"TextDecoder: memory must be (batch, length, context_dim="
                            f"{self.context_dim}); got shape {tuple(memory.shape)}. Set "
                            f"model.decoder.context_dim to the encoder's dim.")
