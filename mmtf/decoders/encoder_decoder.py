"""Encoder + text decoder: teacher-forced loss and generation.

The encoder is any module with an int ``.dim`` whose ``encoder(inputs, lengths=lengths)`` has
``.memory`` (b, m, c_ctx) and ``.mask`` (b, m) bool or None. Targets are ``[*prompt, words ..,
eos, pad ...]``; the decoder reads ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``. The prompt,
targets after the first eos and pads are not scored; the first eos is, also when pad == eos.
Why: docs/design/prompt-and-special-tokens.md.

Shapes: b batch, n target length (with the prompt), m memory length, v vocab, c_ctx = encoder
dim, p prompt length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.decoders.generation import (
    GenerationConfig,
    GenerationOutput,
    LogitsProcessor,
    StepCallback,
    generate,
)
from mmtf.decoders.text import TextDecoder
from mmtf.errors import UserError


class Seq2SeqOutput(NamedTuple):
    """logits: (b, n - 1, v) predictions for ``tokens[:, 1:]``; loss: scalar mean token loss."""

    logits: Tensor
    loss: Tensor


class EncoderDecoder(nn.Module):
    """An encoder and a :class:`TextDecoder` trained with teacher forcing.

    Args:
        encoder: see the module docstring.
        decoder: the text decoder; ``decoder.context_dim`` must equal ``encoder.dim``.
        label_smoothing: cross-entropy label smoothing in [0, 1).
        pad_id: padding id; default ``decoder.pad_id`` (which it must equal).
        eos_id: end-of-sequence id; may equal pad_id (GPT-2, Whisper).
        prompt_ids: the ids every target starts with and generation is fed first. The task
            sets all three ids from its tokenizer (:meth:`set_special_tokens`).

    Raises:
        ValueError: on a width mismatch, bad special ids or label smoothing out of range.
    """

    def __init__(self, *, encoder: nn.Module, decoder: TextDecoder, label_smoothing: float = 0.0,
                 pad_id: int | None = None, eos_id: int = 2, prompt_ids: Sequence[int] = (1,),
                 ) -> None:
        super().__init__()
        enc_dim = getattr(encoder, "dim", None)
        if not isinstance(enc_dim, int):
            raise UserError(f"EncoderDecoder: model.encoder ({type(encoder).__name__}) must have "
                            f"an int attribute dim (its output width); got {enc_dim!r}.")
        if enc_dim != decoder.context_dim:
            raise UserError(f"EncoderDecoder: model.encoder.dim ({enc_dim}) != "
                            f"model.decoder.context_dim ({decoder.context_dim}); set "
                            f"model.decoder.context_dim: ${{model.encoder.dim}}.")
        if not 0.0 <= label_smoothing < 1.0:
            raise UserError(f"EncoderDecoder: label_smoothing ({label_smoothing}) must be in "
                            f"[0, 1).")
        self.encoder, self.decoder = encoder, decoder
        self.label_smoothing = label_smoothing
        self.set_special_tokens(pad_id=decoder.pad_id if pad_id is None else pad_id,
                                eos_id=eos_id, prompt_ids=prompt_ids)

    def set_special_tokens(self, *, pad_id: int, eos_id: int, prompt_ids: Sequence[int]) -> None:
        """Use a tokenizer's ids (checked against the decoder); see the class docstring."""
        prompt_ids = [int(i) for i in prompt_ids]
        if not prompt_ids:
            raise UserError("EncoderDecoder: prompt_ids is empty; the decoder needs at least "
                            "one start token (the tokenizer's bos).")
        vocab = self.decoder.vocab_size
        for name, value in (("pad_id", pad_id), ("eos_id", eos_id),
                            *(("prompt_ids", i) for i in prompt_ids)):
            if not 0 <= value < vocab:
                raise UserError(f"EncoderDecoder: {name} ({value}) must be in [0, "
                                f"model.decoder.vocab_size={vocab}); set "
                                f"model.decoder.vocab_size from the tokenizer.")
        if pad_id != self.decoder.pad_id:
            raise UserError(f"EncoderDecoder: pad_id ({pad_id}) != model.decoder.pad_id "
                            f"({self.decoder.pad_id}); set both from the tokenizer.")
        self.pad_id, self.eos_id, self.prompt_ids = pad_id, eos_id, prompt_ids

    def encode(self, inputs: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Memory (b, m, c_ctx) and mask (b, m) bool or None of an input batch with its (b,)
        valid ``lengths`` (or None)."""
        out = self.encoder(inputs, lengths=lengths)
        return out.memory, getattr(out, "mask", None)

    def encode_features(self, features: Tensor) -> tuple[Tensor, Tensor | None]:
        """:meth:`encode` after the front end, on (b, f, n) log-mel features (long-form)."""
        out = self.encoder.encode_features(features)
        return out.memory, getattr(out, "mask", None)

    def forward(self, inputs: Tensor, lengths: Tensor | None, tokens: Tensor) -> Seq2SeqOutput:
        """Teacher forcing of ``tokens`` (b * k, n): k >= 1 captions per input, item-major,
        against one encoder pass of ``inputs``, ``lengths`` (as in :meth:`encode`). Logits are
        (b * k, n - 1, v)."""
        memory, mask = self._memory_rows(inputs, lengths, tokens)
        logits = self.decoder(tokens[:, :-1], memory, mask)              # (b * k, n - 1, v)
        return Seq2SeqOutput(logits, self.loss(logits, tokens[:, 1:]))

    def _memory_rows(self, inputs: Tensor, lengths: Tensor | None,
                     tokens: Tensor) -> tuple[Tensor, Tensor | None]:
        """One encoder pass, its memory repeated for each of the k caption rows per input."""
        min_len = len(self.prompt_ids) + 1
        if tokens.dim() != 2 or tokens.shape[1] < min_len:
            raise ValueError(f"EncoderDecoder: tokens must be (batch, length >= {min_len}) ids "
                             f"[*prompt, ..., eos]; got shape {tuple(tokens.shape)}.")
        memory, mask = self.encode(inputs, lengths)
        b, rows = memory.shape[0], tokens.shape[0]
        if rows != b:
            if rows % b:
                raise ValueError(f"EncoderDecoder: {rows} caption rows for {b} inputs; tokens "
                                 f"must hold k captions per input (item-major), k >= 1.")
            # k captions per input share its encoder pass (data.captions_per_item)
            memory = memory.repeat_interleave(rows // b, dim=0)           # (b * k, s, d)
            if mask is not None:
                mask = mask.repeat_interleave(rows // b, dim=0)           # (b * k, s)
        return memory, mask

    def mixup_forward(self, inputs: Tensor, lengths: Tensor | None, tokens: Tensor,
                      partner: Tensor, weight: Tensor) -> Seq2SeqOutput:
        """Teacher forcing on mixed inputs: each input's own and its partner's captions.

        Input i is scored as ``weight[i] * CE(caption_i) + (1 - weight[i]) *
        CE(caption_partner[i])`` against input i's memory, summed and divided by the scored
        targets of the own captions; with every weight 1 it is :meth:`forward`.

        Args:
            inputs, lengths, tokens: as in :meth:`forward`, the inputs mixed.
            partner: (b,) long, each input's partner (itself when unmixed).
            weight: (b,) float in [0, 1], the weight of the input's own captions.
        """
        mixed = weight < 1                                                # (b,)
        if not bool(mixed.any()):
            return self.forward(inputs, lengths, tokens)
        memory, mask = self._memory_rows(inputs, lengths, tokens)
        b, rows = partner.shape[0], tokens.shape[0]
        k = rows // b
        offsets = torch.arange(k, device=tokens.device)
        other_rows = (partner.to(tokens.device)[:, None] * k + offsets).flatten()   # (b * k,)
        row_weight = weight.to(memory.device, torch.float32).repeat_interleave(k)   # (b * k,)
        sel = mixed.to(tokens.device).repeat_interleave(k).nonzero().flatten()      # mixed rows
        logits = self.decoder(tokens[:, :-1], memory, mask)              # (b * k, n - 1, v)
        other = tokens[other_rows[sel]]                                  # (r, n)
        other_logits = self.decoder(other[:, :-1], memory[sel],
                                    None if mask is None else mask[sel])  # (r, n - 1, v)
        own = self.token_losses(logits, tokens[:, 1:])                   # (b * k, n - 1)
        theirs = self.token_losses(other_logits, other[:, 1:])           # (r, n - 1)
        scored = (self.scored_targets(tokens[:, 1:]) != -100).sum()
        total = ((row_weight[:, None] * own).sum()
                 + ((1 - row_weight[sel])[:, None] * theirs).sum())
        return Seq2SeqOutput(logits, total / scored.clamp_min(1))

    def scored_targets(self, targets: Tensor) -> Tensor:
        """``targets`` (b, n) with -100 where not scored: the prompt, after the first eos, pads
        (a pad equal to eos is that eos, scored once)."""
        in_prompt = torch.arange(targets.shape[1], device=targets.device) < len(
            self.prompt_ids) - 1                                          # (n,)
        is_eos = ((targets == self.eos_id) & ~in_prompt).long()
        after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0                  # an eos came before
        is_pad = (targets == self.pad_id) & (targets != self.eos_id)
        return targets.masked_fill(in_prompt | after_eos | is_pad, -100)

    def token_losses(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Per-target cross-entropy (b, n), 0 where :meth:`scored_targets` does not score."""
        return F.cross_entropy(logits.flatten(0, 1).float(),
                               self.scored_targets(targets).flatten(), ignore_index=-100,
                               label_smoothing=self.label_smoothing,
                               reduction="none").view(targets.shape)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy of logits (b, n, v) over the scored targets (b, n)
        (``tokens[:, 1:]``; see :meth:`scored_targets`)."""
        return F.cross_entropy(logits.flatten(0, 1).float(),
                               self.scored_targets(targets).flatten(),
                               ignore_index=-100, label_smoothing=self.label_smoothing)

    @torch.inference_mode()
    def generate(self, inputs: Tensor, lengths: Tensor | None = None, *,
                 config: GenerationConfig | None = None, generator: torch.Generator | None = None,
                 callback: StepCallback | None = None, prompt_ids: Sequence[int]
                 | Sequence[Sequence[int]] | Tensor | None = None,
                 processors: Sequence[LogitsProcessor] = (), **options) -> GenerationOutput:
        """Encode once and decode (:func:`mmtf.decoders.generation.generate`); call
        ``model.eval()`` first.

        Args:
            inputs, lengths: encoder inputs, as in :meth:`encode`.
            config: a :class:`GenerationConfig`; ``options`` override its fields.
            generator, callback, processors: as in ``generate``.
            prompt_ids: None = the model's prompt; else one prompt or one per item (b, p).

        Returns:
            :class:`GenerationOutput`: tokens (b, t) or (b, n, t) without the prompt,
            eos-terminated then pad; scores (b,) or (b, n); lengths likewise.
        """
        cfg = GenerationConfig.build(config, **options)
        memory, mask = self.encode(inputs, lengths)
        prompt = self.prompt_ids if prompt_ids is None else prompt_ids
        return generate(self.decoder, memory, mask, cfg, prompt_ids=prompt,
                        eos_id=self.eos_id, pad_id=self.pad_id, generator=generator,
                        callback=callback, processors=processors)
