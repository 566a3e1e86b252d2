"""Encoder + text decoder: teacher-forced loss and generation.

The encoder is any module called as ``encoder(inputs, lengths=lengths)`` that returns an object
with ``.memory`` (b, m, c_ctx) and ``.mask`` (b, m) bool (True = valid, or None), and that has an
int ``.dim`` (``mmtf.encoders``' encoders do; it is duck-typed, not imported). Targets are token
ids ``[bos, w1 .. wk, eos, pad ...]``; the decoder reads ``tokens[:, :-1]`` and predicts
``tokens[:, 1:]``. Targets that are pad, or that come after the first eos, are not scored.

Shapes: b batch, n target length (with bos), m memory length, v vocab, c_ctx = encoder dim.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.decoders.generation import (
    GenerationConfig,
    GenerationOutput,
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
        encoder: module with ``.dim`` returning ``.memory``/``.mask`` (see the module docstring).
        decoder: the text decoder; ``decoder.context_dim`` must equal ``encoder.dim``.
        label_smoothing: cross-entropy label smoothing in [0, 1).
        pad_id, bos_id, eos_id: special token ids (the mmtf tokenizers use 0, 1, 2).

    Raises:
        ValueError: on a width mismatch, bad special ids or label smoothing out of range.
    """

    def __init__(self, *, encoder: nn.Module, decoder: TextDecoder, label_smoothing: float = 0.0,
                 pad_id: int = 0, bos_id: int = 1, eos_id: int = 2) -> None:
        super().__init__()
        enc_dim = getattr(encoder, "dim", None)
        if not isinstance(enc_dim, int):
            raise UserError(f"EncoderDecoder: model.encoder ({type(encoder).__name__}) must have "
                            f"an int attribute dim (its output width); got {enc_dim!r}.")
        if enc_dim != decoder.context_dim:
            raise UserError(f"EncoderDecoder: model.encoder.dim ({enc_dim}) != "
                            f"model.decoder.context_dim ({decoder.context_dim}); set "
                            f"model.decoder.context_dim: ${{model.encoder.dim}}.")
        ids = {"pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id}
        for name, value in ids.items():
            if not 0 <= value < decoder.vocab_size:
                raise UserError(f"EncoderDecoder: {name} ({value}) must be in [0, "
                                f"model.decoder.vocab_size={decoder.vocab_size}); set "
                                 f"model.decoder.vocab_size from the tokenizer.")
        if len(set(ids.values())) != 3:
            raise UserError(f"EncoderDecoder: pad_id, bos_id and eos_id must differ; got {ids}.")
        if pad_id != decoder.pad_id:
            raise UserError(f"EncoderDecoder: pad_id ({pad_id}) != model.decoder.pad_id "
                            f"({decoder.pad_id}); set both from the tokenizer.")
        if not 0.0 <= label_smoothing < 1.0:
            raise UserError(f"EncoderDecoder: label_smoothing ({label_smoothing}) must be in "
                            f"[0, 1).")
        self.encoder, self.decoder = encoder, decoder
        self.label_smoothing = label_smoothing
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

    def encode(self, inputs: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Run the encoder once.

        Args:
            inputs: the encoder's input batch (waveforms, images, features).
            lengths: (b,) valid input lengths, or None.

        Returns:
            memory (b, m, c_ctx) and its mask (b, m) bool (True = valid) or None.
        """
        out = self.encoder(inputs, lengths=lengths)
        return out.memory, getattr(out, "mask", None)

    def forward(self, inputs: Tensor, lengths: Tensor | None, tokens: Tensor) -> Seq2SeqOutput:
        """Teacher forcing.

        Args:
            inputs, lengths: encoder inputs, as in :meth:`encode`.
            tokens: (b * k, n) long targets, ``[bos, words .., eos, pad ...]``: k >= 1
                captions per input, item-major (rows i*k .. i*k+k-1 describe input i), all
                decoded against one encoder pass of their input.

        Returns:
            :class:`Seq2SeqOutput` with logits (b * k, n - 1, v) and the mean loss over scored
            targets.
        """
        if tokens.dim() != 2 or tokens.shape[1] < 2:
            raise ValueError(f"EncoderDecoder: tokens must be (batch, length >= 2) ids "
                             f"[bos, ..., eos]; got shape {tuple(tokens.shape)}.")
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
        logits = self.decoder(tokens[:, :-1], memory, mask)              # (b * k, n - 1, v)
        return Seq2SeqOutput(logits, self.loss(logits, tokens[:, 1:]))

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy over targets that are neither pad nor after the first eos.

        Args:
            logits: (b, n, v).
            targets: (b, n) long.
        """
        is_eos = (targets == self.eos_id).long()
        after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0                  # an eos came before
        ignore = (targets == self.pad_id) | after_eos
        return F.cross_entropy(logits.flatten(0, 1).float(),
                               targets.masked_fill(ignore, -100).flatten(),
                               ignore_index=-100, label_smoothing=self.label_smoothing)

    @torch.inference_mode()
    def generate(self, inputs: Tensor, lengths: Tensor | None = None, *,
                 config: GenerationConfig | None = None, generator: torch.Generator | None = None,
                 callback: StepCallback | None = None, **options) -> GenerationOutput:
        """Encode once and decode (see :mod:`mmtf.decoders.generation` for the conventions).

        Call ``model.eval()`` first: dropout is not switched off here.

        Args:
            inputs, lengths: encoder inputs, as in :meth:`encode`.
            config: a :class:`GenerationConfig`; ``options`` override its fields (strategy,
                max_new_tokens, min_new_tokens, num_beams, length_penalty, early_stopping,
                num_return_sequences, temperature, top_k, top_p, use_cache, compile), so
                ``generate(x, lengths, **asdict(cfg))`` and ``generate(x, config=cfg)`` agree.
            generator: random generator for sampling.
            callback: ``callback(step, tokens, logits)`` after every step.

        Returns:
            :class:`GenerationOutput`: tokens (b, t) or (b, n, t) without bos, eos-terminated
            then pad; scores (b,) or (b, n); lengths likewise.
        """
        cfg = GenerationConfig.build(config, **options)
        memory, mask = self.encode(inputs, lengths)
        return generate(self.decoder, memory, mask, cfg, bos_id=self.bos_id, eos_id=self.eos_id,
                        pad_id=self.pad_id, generator=generator, callback=callback)
