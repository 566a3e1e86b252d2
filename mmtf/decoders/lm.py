"""Decoder-only causal language model (Llama, Qwen2, Qwen3 ...) on the one attention core.

Token embedding (or caller-given ``inputs_embeds``, where a prefix model splices media
embeddings) -> ``depth`` pre-norm blocks of causal self-attention with RoPE and an MLP
(:class:`mmtf.nn.TransformerStack`, no cross-attention) -> final norm -> LM head, tied to the
embedding or not. Left padding works as in transformers: positions count only real tokens
(``attention_mask.cumsum - 1``), and padded keys are masked.

:class:`LMCache` carries the per-layer K/V caches, the key mask of every cached position and
each row's next position, so cached decoding of a left-padded batch equals the uncached pass.
:meth:`CausalLM.generate` runs mmtf's greedy, sampling and beam search
(:func:`mmtf.decoders.generation.generate`) on it.

Shapes: b batch (or batch * beams), n new positions, m cached + new positions, c = dim,
v = vocab_size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mmtf.decoders.generation import GenerationConfig, GenerationOutput, generate
from mmtf.errors import UserError, in_config
from mmtf.nn import KVCache, TransformerStack
from mmtf.nn.linear import Linear
from mmtf.nn.transformer import BlockOptions
from mmtf.utils.parts import as_part


@dataclass
class LMCache:
    """Per-generation state of a :class:`CausalLM`, built by :meth:`CausalLM.make_cache`.

    Attributes:
        layers: one self-attention KVCache per block.
        key_mask: (b, max_len) bool, True = a real (non-pad) cached position.
        next_position: (b,) long, the RoPE position of each row's next real token.
        padded: whether any cached position is padding (else no mask is built at all).
    """

    layers: list[KVCache]
    key_mask: Tensor
    next_position: Tensor
    padded: bool = False

    @property
    def length(self) -> int:
        """Positions already cached."""
        return self.layers[0].length

    @property
    def max_len(self) -> int:
        return self.layers[0].max_len

    @property
    def filled(self) -> bool:
        """Whether the prompt has been fed (generation's first step feeds it whole)."""
        return self.length > 0

    def reorder(self, index: Tensor) -> None:
        """Follow surviving beams: row i becomes row ``index[i]``."""
        for cache in self.layers:
            cache.reorder(index)
        self.key_mask = self.key_mask.index_select(0, index)
        self.next_position = self.next_position.index_select(0, index)

    def reset(self) -> None:
        for cache in self.layers:
            cache.reset()
        self.key_mask.fill_(True)
        self.next_position.zero_()
        self.padded = False


class CausalLM(nn.Module):
    """A decoder-only transformer language model.

    Args:
        vocab_size: token ids are in ``[0, vocab_size)``.
        dim, depth, num_heads, block, activation_checkpointing: as
            :class:`mmtf.nn.TransformerStack` (``block`` sets GQA, SwiGLU, RMSNorm, head_dim,
            q/k norm, biases).
        max_len: the positions the model was trained for (``max_position_embeddings``);
            longer inputs raise.
        rope_base, rope_scaling: RoPE's theta and frequency scaling
            (:class:`mmtf.nn.RotaryEmbedding`).
        tie_embeddings: the LM head shares the token embedding's weight.
        pad_id, bos_id, eos_id: special token ids (None: the model has none).
    """

    def __init__(self, *, vocab_size: int, dim: int, depth: int, num_heads: int,
                 block: BlockOptions | Mapping[str, Any] | None = None, max_len: int = 2048,
                 rope_base: float = 10000.0, rope_scaling: Mapping[str, Any] | None = None,
                 tie_embeddings: bool = False, pad_id: int | None = None,
                 bos_id: int | None = None, eos_id: int | None = None,
                 activation_checkpointing: bool = False) -> None:
        super().__init__()
        block = as_part(BlockOptions, block)
        for name, value in (("vocab_size", vocab_size), ("dim", dim), ("max_len", max_len)):
            if value < 1:
                raise UserError(f"CausalLM: {name} ({value}) must be >= 1; check "
                                f"model.decoder.{name}.")
        for name, value in (("pad_id", pad_id), ("bos_id", bos_id), ("eos_id", eos_id)):
            if value is not None and not 0 <= value < vocab_size:
                raise UserError(f"CausalLM: {name} ({value}) must be in [0, vocab_size="
                                f"{vocab_size}) or null.")
        self.vocab_size, self.dim, self.depth, self.max_len = vocab_size, dim, depth, max_len
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.tie_embeddings = bool(tie_embeddings)
        self.embed = nn.Embedding(vocab_size, dim)
        with in_config("model.decoder"):
            self.stack = TransformerStack(
                depth=depth, dim=dim, num_heads=num_heads, block=block, causal=True,
                rope=True, rope_base=rope_base, rope_scaling=rope_scaling,
                max_len=max_len, activation_checkpointing=activation_checkpointing)
        self.lm_head = Linear(dim, vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        if self.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        else:
            nn.init.normal_(self.lm_head.weight, std=0.02)

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, max_len={self.max_len}, "
                f"tie_embeddings={self.tie_embeddings}")

    def embed_tokens(self, input_ids: Tensor) -> Tensor:
        """Token embeddings, (b, n) -> (b, n, c): what ``inputs_embeds`` replaces."""
        return self.embed(input_ids)

    @torch.no_grad()
    def grow_vocab(self, n: int) -> range:
        """Add ``n`` token rows to the embedding and the LM head (one shared matrix when tied),
        for tokens a tokenizer added (a media placeholder, chat markers); returns their ids.

        New rows start at the mean of the existing rows, in both matrices (LLaVA's and
        Alpaca's rule): the new tokens' logits start at the average logit, so a model that has
        not learned them yet does not prefer them. Call it before building the optimizer, EMA or
        LoRA (they hold the old Parameters); the new Parameters keep ``requires_grad``, so a
        frozen LLM leaves the rows at their mean.

        Raises:
            UserError: ``n`` < 1.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(f"CausalLM.grow_vocab: n ({n!r}) must be an integer >= 1.")
        old = self.vocab_size

        def grown(weight: nn.Parameter) -> nn.Parameter:
            rows = weight.mean(dim=0, keepdim=True).expand(n, -1)           # (n, c)
            return nn.Parameter(torch.cat([weight, rows]), requires_grad=weight.requires_grad)

        self.embed.weight = grown(self.embed.weight)                      # (v + n, c)
        self.embed.num_embeddings = old + n
        self.lm_head.weight = (self.embed.weight if self.tie_embeddings
                               else grown(self.lm_head.weight))
        self.lm_head.out_features = old + n
        self.vocab_size = old + n
        return range(old, old + n)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, inputs_embeds: Tensor | None = None, *,
                cache: LMCache | None = None) -> Tensor:
        """Next-token logits of every new position.

        Args:
            input_ids: (b, n) long; or None with ``inputs_embeds``.
            attention_mask: (b, n) (or, with a cache, (b, cached + n)) bool or 0/1, 1 = a real
                token; None = all real. Left padding: positions count real tokens only.
            position_ids: (b, n) long RoPE positions; default from the mask (cumsum - 1, pads
                at 1, as transformers), continuing the cache's.
            inputs_embeds: (b, n, c) instead of ``input_ids`` (media embeddings spliced in).
            cache: from :meth:`make_cache`; advanced by n positions in place.

        Returns:
            Logits, (b, n, v), in the dtype of the weights.

        Raises:
            UserError: neither or both of ids and embeddings, or more positions than
                ``max_len`` (or the cache) holds.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise UserError("CausalLM: pass exactly one of input_ids (b, n) and inputs_embeds "
                            "(b, n, dim).")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds  # (b, n, c)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise UserError(f"CausalLM: inputs_embeds must be (batch, length, dim={self.dim}); "
                            f"got shape {tuple(x.shape)}.")
        b, n = x.shape[:2]
        offset = 0 if cache is None else cache.length
        limit = self.max_len if cache is None else min(self.max_len, cache.max_len)
        if offset + n > limit:
            raise UserError(f"CausalLM: {offset} + {n} positions exceed the model's "
                            f"{self.max_len} positions (max_position_embeddings)"
                            f"{'' if cache is None else f' or the cache of {cache.max_len}'}; "
                            f"shorten the prompt or generate fewer tokens.")
        new_mask = self._new_mask(attention_mask, b, n, offset, x.device)      # (b, n) or None
        positions, key_mask = self._positions(new_mask, position_ids, cache, b, n, x.device)
        if cache is None:
            x = self.stack(x, key_mask=key_mask, positions=positions)
        else:
            x = self.stack(x, key_mask=key_mask, positions=positions, cache=cache.layers)
        return self.lm_head(x)                                               # (b, n, v)

    def _new_mask(self, attention_mask: Tensor | None, b: int, n: int, offset: int,
                  device: torch.device) -> Tensor | None:
        """The (b, n) bool mask of the new positions, None when all of them are real."""
        if attention_mask is None:
            return None
        mask = attention_mask.to(device=device).bool()
        if mask.dim() != 2 or mask.shape[0] != b or mask.shape[1] not in (n, offset + n):
            raise UserError(f"CausalLM: attention_mask must be (batch={b}, {n}) or, with a "
                            f"cache, (batch={b}, cached + new = {offset + n}); got shape "
                            f"{tuple(mask.shape)}.")
        mask = mask[:, -n:]
        return None if bool(mask.all()) else mask

    def _positions(self, new_mask: Tensor | None, position_ids: Tensor | None,
                   cache: LMCache | None, b: int, n: int, device: torch.device,
                   ) -> tuple[Tensor | None, Tensor | None]:
        """RoPE positions (b, n) (None: ``offset + arange(n)`` for every row) and the key mask
        (b, m) (None: every key real); the cache's state advanced."""
        offset = 0 if cache is None else cache.length
        padded = new_mask is not None or (cache is not None and cache.padded)
        if position_ids is not None:
            positions = position_ids.to(device=device, dtype=torch.long)
            if tuple(positions.shape) != (b, n):
                raise UserError(f"CausalLM: position_ids must be (batch={b}, {n}); got shape "
                                f"{tuple(positions.shape)}.")
            # Arbitrary positions may exceed the index bound the table is extended from.
            self.stack.rope.reserve(int(positions.max()) + 1)
        elif padded:
            real = (torch.ones(b, n, dtype=torch.long, device=device) if new_mask is None
                    else new_mask.long())
            start = (torch.zeros(b, dtype=torch.long, device=device) if cache is None
                     else cache.next_position)
            positions = start[:, None] + real.cumsum(-1) - 1                      # (b, n)
            positions = positions.masked_fill(real == 0, 1)
        else:
            positions = None
        if cache is None:
            return positions, new_mask
        end = offset + n
        if new_mask is not None:
            cache.key_mask[:, offset:end] = new_mask
        else:
            cache.key_mask[:, offset:end] = True
        cache.padded = padded
        if positions is None:
            cache.next_position += n
        elif new_mask is None:
            cache.next_position = positions[:, -1] + 1
        else:
            cache.next_position = cache.next_position + new_mask.long().sum(-1)
        return positions, (cache.key_mask[:, :end] if padded else None)

    def make_cache(self, *, batch_size: int, max_len: int | None = None,
                   dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                   ) -> LMCache:
        """Preallocate the K/V caches of one generation.

        Args:
            batch_size: rows b (batch * beams for beam search).
            max_len: positions to hold (default and upper bound: ``self.max_len``).
            dtype, device: of the buffers; default: those of the parameters.
        """
        max_len = self.max_len if max_len is None else max_len
        if not 1 <= max_len <= self.max_len:
            raise UserError(f"CausalLM: cache max_len ({max_len}) must be in [1, "
                            f"max_position_embeddings={self.max_len}]; shorten the prompt or "
                            f"generate fewer tokens.")
        weight = self.embed.weight
        device = device or weight.device
        layers, _ = self.stack.make_cache(batch_size=batch_size, max_len=max_len,
                                          dtype=dtype or weight.dtype, device=device)
        return LMCache(layers=layers,
                       key_mask=torch.ones(batch_size, max_len, dtype=torch.bool, device=device),
                       next_position=torch.zeros(batch_size, dtype=torch.long, device=device))

    @torch.no_grad()
    def generate(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                 *, inputs_embeds: Tensor | None = None, config: GenerationConfig | None = None,
                 eos_id: int | None = None, generator: torch.Generator | None = None,
                 **overrides: Any) -> GenerationOutput:
        """Continue left-padded prompts with greedy, sampling or beam search on the cache.

        Args:
            input_ids: (b, p) long prompts, left-padded (or None with ``inputs_embeds``).
                Given with ``inputs_embeds``, they are the prompt's ids for the repeat
                penalties only (the embeddings feed the model).
            attention_mask: (b, p), 1 = a real token; None = no padding.
            inputs_embeds: (b, p, c) prompt embeddings instead of ids (a prefix model's
                spliced media and text, :class:`mmtf.decoders.prefix.MediaPrefixLM`).
            config, overrides: decoding options (:class:`GenerationConfig`);
                ``compile`` is not available here.
            eos_id: where a row stops (default: the model's ``eos_id``).
            generator: random generator for sampling.

        Returns:
            The generated tokens only (:class:`GenerationOutput`), eos-terminated, then
            padded with eos.

        Raises:
            UserError: no eos id, ``compile=True``, or prompt + new tokens longer than the
                model's positions.
        """
        config = GenerationConfig.build(config, **overrides)
        eos = self.eos_id if eos_id is None else eos_id
        if eos is None:
            raise UserError("CausalLM.generate: the model has no eos_id; pass eos_id=<the "
                            "tokenizer's end-of-sequence id>.")
        if config.compile:
            raise UserError("CausalLM.generate: compile=True is not available for "
                            "decoder-only LMs yet; drop it.")
        if inputs_embeds is None:
            if input_ids is None:
                raise UserError("CausalLM.generate: pass input_ids or inputs_embeds.")
            inputs_embeds = self.embed_tokens(input_ids)                     # (b, p, c)
        b, p = inputs_embeds.shape[:2]
        if p + config.max_new_tokens - 1 > self.max_len:
            raise UserError(f"CausalLM.generate: the prompt ({p} tokens) + max_new_tokens "
                            f"({config.max_new_tokens}) - 1 exceed the model's {self.max_len} "
                            f"positions (max_position_embeddings); shorten the prompt or lower "
                            f"max_new_tokens.")
        ids = (input_ids if input_ids is not None
               else torch.full((b, p), eos, dtype=torch.long, device=inputs_embeds.device))
        mask = None if attention_mask is None else attention_mask.to(inputs_embeds.device).bool()
        # The prompt travels as generation's "memory" (it is expanded per beam or sample with
        # it); the prompt ids themselves may be generated again (ban_prompt=False).
        return generate(_PromptStepper(self), inputs_embeds, mask, config,
                        prompt_ids=ids.to(inputs_embeds.device), eos_id=eos, pad_id=eos,
                        generator=generator, ban_prompt=False)


class _PromptStepper(nn.Module):
    """:class:`CausalLM` behind generation's step protocol: the "memory" is the prompt's
    embeddings (b, p, c) and the "memory mask" its attention mask (b, p)."""

    def __init__(self, lm: CausalLM) -> None:
        super().__init__()
        self.lm = lm
        self.max_len = lm.max_len

    def make_cache(self, *, batch_size: int, context_len: int, max_len: int | None = None,
                   ) -> LMCache:
        return self.lm.make_cache(batch_size=batch_size, max_len=max_len)

    def step(self, tokens: Tensor, cache: LMCache, *, memory: Tensor | None = None,
             memory_mask: Tensor | None = None) -> Tensor:
        if not cache.filled:                              # the whole prompt, (b, p, c)
            return self.lm(inputs_embeds=memory, attention_mask=memory_mask, cache=cache)
        return self.lm(tokens, cache=cache)                                   # (b, 1, v)

    def forward(self, tokens: Tensor, memory: Tensor, memory_mask: Tensor | None = None,
                ) -> Tensor:
        """Uncached reference: the prompt's embeddings, then the tokens generated after it."""
        p = memory.shape[1]
        x = torch.cat([memory, self.lm.embed_tokens(tokens[:, p:])], dim=1)  # (b, p + t, c)
        mask = None
        if memory_mask is not None:
            mask = torch.cat([memory_mask, memory_mask.new_ones(tokens.shape[0],
                                                                tokens.shape[1] - p)], dim=1)
        return self.lm(inputs_embeds=x, attention_mask=mask)


__all__ = ["CausalLM", "LMCache"]
