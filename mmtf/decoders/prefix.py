"""A multimodal prefix model: encoder -> projector -> decoder-only LLM (LLaVA, SALMONN, SLAM-AAC).

Each item's text holds one media placeholder token (``media_token_id``, e.g. ``<|audio|>``);
:meth:`MediaPrefixLM.splice` replaces it by the item's projected media sequence, which is
longer than one token, and builds the spliced embeddings, attention mask, labels (-100 on
media) and ids at the new lengths. Items whose media or text lengths differ are padded on the
side their text was padded on (generation: always left), and the LLM takes its positions from
the mask (``cumsum - 1``), so padding changes no logit of a real position.

Labels come in the tokenizer's alignment (``labels[j]`` is the target *at* position j, -100
where not trained); :func:`answer_loss` is the one place they are shifted. Why:
docs/design/prefix-model.md.

Shapes: b batch, t text length (padded), w spliced length (padded), k projected media
positions (padded), c = the LLM's hidden size, v vocab.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.decoders.generation import GenerationConfig, GenerationOutput
from mmtf.decoders.lm import CausalLM
from mmtf.errors import UserError
from mmtf.nn.projectors import ProjectorOutput, build_projector

IGNORE = -100   # the label of a position that is not trained (cross_entropy's ignore_index)


class Spliced(NamedTuple):
    """A batch with each placeholder replaced by its item's media, padded to one width w.

    Attributes:
        embeds: (b, w, c) the LLM's input embeddings; zero on padding.
        attention_mask: (b, w) bool, True = a real (text or media) position.
        labels: (b, w) long, -100 on media, padding and untrained text; None without labels.
        input_ids: (b, w) long: the text ids, ``media_token_id`` on media, the pad id on
            padding (what generation's repeat penalties see).
        media_positions: (b, w) bool, True where the embeddings are the projector's output.
    """

    embeds: Tensor
    attention_mask: Tensor
    labels: Tensor | None
    input_ids: Tensor
    media_positions: Tensor


class PrefixOutput(NamedTuple):
    """logits: (b, w, v) of every spliced position; loss: :func:`answer_loss` (None without
    labels); inputs: the spliced batch the logits are aligned with."""

    logits: Tensor
    loss: Tensor | None
    inputs: Spliced


def answer_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean next-token cross-entropy over the trained tokens: the one shift of the labels.

    Position j's logits predict the token at j + 1, so ``logits[:, :-1]`` are scored against
    ``labels[:, 1:]``; labels of -100 (prompt, media, padding) are not scored. The mean is over
    every trained token of the batch (a long answer weighs more than a short one, as
    transformers' causal LM loss); 0 when none is trained.

    Args:
        logits: (b, w, v) float.
        labels: (b, w) long, unshifted (aligned with the inputs), -100 where not trained.
    """
    targets = labels[:, 1:].reshape(-1)                                  # (b * (w - 1),)
    total = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets,
                            ignore_index=IGNORE, reduction="sum")
    return total / (targets != IGNORE).sum().clamp_min(1)


class MediaPrefixLM(nn.Module):
    """An encoder, a projector and a :class:`~mmtf.decoders.lm.CausalLM`, the media spliced
    into the text at a placeholder token.

    Args:
        encoder: any mmtf encoder (``encoder(inputs, lengths) -> EncoderOutput``, int ``dim``).
        decoder: the LLM (``llm_decoder``).
        projector: ``{"kind": name, **settings}`` of :data:`mmtf.nn.projectors.PROJECTORS`, a
            callable taking ``in_dim`` and ``out_dim`` (a ``_target_`` with ``_partial_:
            true``) or a built module (:func:`mmtf.nn.projectors.build_projector`).
        media_token_id: the placeholder's id (one token; the tokenizer's ``<|audio|>`` /
            ``<|image|>``); None = set later (:meth:`set_media_token`, from the tokenizer).
        grow_vocab: when ``media_token_id`` is past the LLM's vocabulary, add the missing rows
            (:meth:`CausalLM.grow_vocab`) instead of refusing.

    Raises:
        UserError: widths that do not fit, or a placeholder id outside the vocabulary.
    """

    def __init__(self, *, encoder: nn.Module, decoder: CausalLM,
                 projector: Mapping[str, Any] | str | Callable[..., nn.Module] | nn.Module,
                 media_token_id: int | None, grow_vocab: bool = False) -> None:
        super().__init__()
        enc_dim = getattr(encoder, "dim", None)
        if not isinstance(enc_dim, int):
            raise UserError(f"MediaPrefixLM: model.encoder ({type(encoder).__name__}) must have "
                            f"an int attribute dim (its output width); got {enc_dim!r}.")
        self.encoder, self.decoder = encoder, decoder
        self.projector = build_projector(
            projector, in_dim=enc_dim, out_dim=decoder.dim,
            prefix_tokens=int(getattr(encoder, "num_prefix_tokens", 0)))
        self.media_token_id: int | None = None
        if media_token_id is not None:
            self.set_media_token(media_token_id, grow_vocab=grow_vocab)
        ids = (decoder.pad_id, decoder.eos_id, 0)
        self.pad_id = next(i for i in ids if i is not None)

    def set_media_token(self, media_token_id: int, *, grow_vocab: bool = False) -> None:
        """Use ``media_token_id`` as the placeholder (the task resolves it from its tokenizer),
        growing the LLM's vocabulary to it when ``grow_vocab``.

        Raises:
            UserError: not an id >= 0, or past the vocabulary without ``grow_vocab``.
        """
        decoder = self.decoder
        if isinstance(media_token_id, bool) or not isinstance(media_token_id, int) \
                or media_token_id < 0:
            raise UserError(f"MediaPrefixLM: model.media_token_id ({media_token_id!r}) must be "
                            f"the placeholder token's id (an integer >= 0).")
        if media_token_id >= decoder.vocab_size:
            if not grow_vocab:
                raise UserError(
                    f"MediaPrefixLM: model.media_token_id ({media_token_id}) is past the LLM's "
                    f"vocabulary ({decoder.vocab_size} rows); set model.grow_vocab=true to add "
                    f"{media_token_id + 1 - decoder.vocab_size} row(s), or use an id the model "
                    f"has (a reserved special token).")
            decoder.grow_vocab(media_token_id + 1 - decoder.vocab_size)
        self.media_token_id = media_token_id

    def encode(self, media: Tensor, media_mask: Tensor | None = None) -> ProjectorOutput:
        """The projected media of a batch: embeds (b, k, c), mask (b, k).

        Args:
            media: the encoder's input (waveforms (b, samples), images (b, 3, h, w) ...).
            media_mask: (b, n) bool over media's axis 1, True = valid (samples first), or None
                = every item whole.
        """
        if media_mask is None:
            out = self.encoder(media)
        else:
            if media_mask.dtype != torch.bool or tuple(media_mask.shape) != tuple(media.shape[:2]):
                raise UserError(f"MediaPrefixLM: media_mask must be bool of shape "
                                f"{tuple(media.shape[:2])} (True = a valid sample); got "
                                f"{media_mask.dtype} {tuple(media_mask.shape)}.")
            out = self.encoder(media, lengths=media_mask.sum(dim=1))
        return self.projector(out.memory, out.mask)

    def splice(self, input_ids: Tensor, attention_mask: Tensor | None, media: ProjectorOutput,
               labels: Tensor | None = None, *, padding_side: str | None = None) -> Spliced:
        """Replace each item's placeholder by its valid media positions.

        Args:
            input_ids: (b, t) long, one placeholder per item among its real tokens.
            attention_mask: (b, t), 1 = a real token (left or right padding); None = all real.
            media: the projected media (:meth:`encode`).
            labels: (b, t) long, unshifted, -100 where not trained; or None.
            padding_side: "left" | "right" of the result; None = the text's (right when some
                row's last token is padding, else left).

        Raises:
            UserError: an item without its one placeholder, or longer than the LLM's positions
                once spliced; the message names the item.
        """
        if input_ids.dim() != 2:
            raise UserError(f"MediaPrefixLM: input_ids must be (batch, length); got shape "
                            f"{tuple(input_ids.shape)}.")
        if self.media_token_id is None:
            raise UserError("MediaPrefixLM: no media placeholder id yet; hand the task its "
                            "tokenizer (task.use_tokenizer) or set model.media_token_id.")
        b, t = input_ids.shape
        device = input_ids.device
        real = (torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None
                else attention_mask.to(device).bool())
        for name, value in (("attention_mask", real), ("labels", labels)):
            if value is not None and tuple(value.shape) != (b, t):
                raise UserError(f"MediaPrefixLM: {name} must have the shape of input_ids "
                                f"{(b, t)}; got {tuple(value.shape)}.")
        if media.embeds.shape[0] != b:
            raise UserError(f"MediaPrefixLM: {media.embeds.shape[0]} media for {b} prompts; "
                            f"each item needs one.")
        if padding_side not in (None, "left", "right"):
            raise UserError(f"MediaPrefixLM: padding_side ({padding_side!r}) must be 'left', "
                            f"'right' or None.")
        is_media = (input_ids == self.media_token_id) & real                  # (b, t)
        counts = is_media.sum(dim=1)
        bad = (counts != 1).nonzero().flatten().tolist()
        if bad:
            i = bad[0]
            raise UserError(f"MediaPrefixLM: item {i} of the batch holds {int(counts[i])} media "
                            f"placeholders (id {self.media_token_id}); each item needs exactly "
                            f"one, where its media goes ({len(bad)} item(s) of {b} do not).")
        media_len = media.mask.sum(dim=1).to(device)                          # (b,)
        text_len = real.sum(dim=1) - 1
        lengths = text_len + media_len                                        # (b,)
        limit = self.decoder.max_len
        over = (lengths > limit).nonzero().flatten().tolist()
        if over:
            i = over[0]
            raise UserError(f"MediaPrefixLM: item {i} is {int(lengths[i])} positions once spliced "
                            f"({int(text_len[i])} text tokens + {int(media_len[i])} media "
                            f"positions), more than the LLM's {limit} (max_position_embeddings); "
                            f"shorten the text or the media, or project to fewer positions.")
        width = int(lengths.max())
        side = padding_side or ("left" if bool(real[:, -1].all()) else "right")
        start = width - lengths if side == "left" else torch.zeros_like(lengths)  # (b,)

        # Where each real text token and each valid media position lands: text before the
        # placeholder keeps its rank, text after it moves by (media length - 1).
        rank = real.long().cumsum(dim=1) - 1                                  # (b, t)
        at = (rank * is_media).sum(dim=1)                                     # (b,)
        text_dest = start[:, None] + rank + (rank > at[:, None]) * (media_len[:, None] - 1)
        media_mask = media.mask.to(device)
        media_dest = start[:, None] + at[:, None] + media_mask.long().cumsum(dim=1) - 1  # (b, k)
        tr, tc = (real & ~is_media).nonzero(as_tuple=True)
        mr, mc = media_mask.nonzero(as_tuple=True)
        text_at, media_at = (tr, text_dest[tr, tc]), (mr, media_dest[mr, mc])

        text = self.decoder.embed_tokens(input_ids[tr, tc])                   # (text tokens, c)
        embeds = text.new_zeros(b, width, text.shape[-1])
        embeds = embeds.index_put(text_at, text)
        embeds = embeds.index_put(media_at, media.embeds[mr, mc].to(device, embeds.dtype))
        mask = torch.zeros(b, width, dtype=torch.bool, device=device)
        mask[text_at] = True
        mask[media_at] = True
        media_positions = torch.zeros_like(mask)
        media_positions[media_at] = True
        ids = torch.full((b, width), self.pad_id, dtype=torch.long, device=device)
        ids[text_at] = input_ids[tr, tc]
        ids[media_at] = self.media_token_id
        out_labels = None
        if labels is not None:
            out_labels = torch.full((b, width), IGNORE, dtype=torch.long, device=device)
            out_labels[text_at] = labels.to(device)[tr, tc]
        return Spliced(embeds, mask, out_labels, ids, media_positions)

    def forward(self, media: Tensor, media_mask: Tensor | None, input_ids: Tensor,
                attention_mask: Tensor | None = None, labels: Tensor | None = None,
                ) -> PrefixOutput:
        """Logits of the spliced batch and, with ``labels``, :func:`answer_loss`.

        Args:
            media, media_mask: as :meth:`encode`.
            input_ids, attention_mask, labels: as :meth:`splice` (left or right padding).
        """
        inputs = self.splice(input_ids, attention_mask, self.encode(media, media_mask), labels)
        logits = self.decoder(inputs_embeds=inputs.embeds,
                              attention_mask=inputs.attention_mask)             # (b, w, v)
        loss = None if inputs.labels is None else answer_loss(logits, inputs.labels)
        return PrefixOutput(logits, loss, inputs)

    @torch.no_grad()
    def generate(self, media: Tensor, media_mask: Tensor | None, input_ids: Tensor,
                 attention_mask: Tensor | None = None, *, config: GenerationConfig | None = None,
                 eos_id: int | None = None, generator: torch.Generator | None = None,
                 **overrides: Any) -> GenerationOutput:
        """Continue prompts that end in the generation prompt (``<|im_start|>assistant\\n``):
        the spliced prompt is prefilled once, then :meth:`CausalLM.generate` decodes on its
        cache. The placeholder id is never generated.

        Args:
            media, media_mask: as :meth:`encode`.
            input_ids, attention_mask: (b, t) prompts, left-padded (right padding is moved to
                the left when spliced).
            config, generator, overrides: :class:`GenerationConfig` and its fields.
            eos_id: where a row stops (the chat template's end of turn); default the LLM's.

        Returns:
            The generated tokens only (:class:`GenerationOutput`).
        """
        cfg = GenerationConfig.build(config, **overrides)
        cfg = dataclasses.replace(cfg, suppress_tokens=tuple(
            dict.fromkeys([*cfg.suppress_tokens, self.media_token_id])))
        inputs = self.splice(input_ids, attention_mask, self.encode(media, media_mask),
                             padding_side="left")
        return self.decoder.generate(inputs.input_ids, inputs.attention_mask,
                                     inputs_embeds=inputs.embeds, config=cfg, eos_id=eos_id,
                                     generator=generator)


__all__ = ["IGNORE", "MediaPrefixLM", "PrefixOutput", "Spliced", "answer_loss"]
