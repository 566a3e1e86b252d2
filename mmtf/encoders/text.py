"""Text encoder: token ids and a padding mask -> contextual states, pooled to one embedding.

One class for mmtf's own from-scratch text tower (pre-norm blocks, RoPE or learned positions,
mmtf's BPE tokenizer; ``conf/model/text_encoder/``) and for imported BERT-family models (post-norm
blocks, learned positions with token types and an embedding LayerNorm;
:mod:`mmtf.pretrained.bert` configures it): a :class:`~mmtf.nn.TokenEmbedding` and a bidirectional
:class:`~mmtf.nn.TransformerStack` on the one attention core. :meth:`TextEncoder.embed` pools the
states (mean over valid tokens, the first token, or the last valid one), applies an optional
projection head and L2-normalises on request: the text tower of a contrastive model.

:class:`TextEmbedder` pairs an encoder with a tokenizer: strings in, embeddings out
(``mmtf.load(<BERT / sentence-transformers folder>)`` returns one). Why post-norm is a block
option and not a second transformer: docs/design/text-encoders.md.

Shapes: b batch, n tokens, c = dim, e = embed_dim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.encoders.base import POOL_MODES, Encoder, EncoderOutput, PoolMode, pool, record_config
from mmtf.errors import UserError, in_config
from mmtf.nn import EmbeddingOptions, TokenEmbedding, TransformerStack
from mmtf.nn.heads import HEAD_KINDS, HeadKind, projection
from mmtf.nn.transformer import AttentionLayers, AttentionMaps, BlockOptions
from mmtf.text.base import Tokenizer
from mmtf.utils.parts import as_part

PositionKind = Literal["rope", "learned"]
# Where the encoder's keys live in a config, for messages.
NODE = "model.text_encoder"


@dataclass(frozen=True)
class PoolingOptions:
    """How the states become one vector per text (``model.text_encoder.pooling``).

    Args:
        mode: "mean" (over valid tokens, the specials included, as sentence-transformers),
            "cls" (the first token: BERT's ``[CLS]``, mmtf's ``<bos>``) or "last" (the last
            valid token: a causal encoder's end of text).
        head: after pooling, "none", "linear" (c -> embed_dim without bias, as CLIP's text
            projection) or "mlp" (c -> head_hidden -> embed_dim, GELU between).
        embed_dim: the embedding's width; None = dim (only without a head).
        head_hidden: the MLP head's hidden width; None = dim.
        normalize: L2-normalise the embedding (a dot product is then the cosine).
    """

    mode: PoolMode = "mean"
    head: HeadKind = "none"
    embed_dim: int | None = None
    head_hidden: int | None = None
    normalize: bool = False


class TextEncoder(Encoder):
    """Token ids (b, n) and a padding mask -> memory (b, n, c), mask (b, n); ``embed`` -> (b, e).

    Args:
        vocab_size: token ids are in ``[0, vocab_size)`` (the tokenizer's size).
        dim, depth, num_heads, block, final_norm, activation_checkpointing: the transformer
            (:class:`mmtf.nn.TransformerStack`; ``block.postnorm`` for BERT, whose stack has
            no final norm; ``block.dropout`` also after the embedding).
        embedding: token types, the position table's offset and rule, the embedding norm
            (:class:`~mmtf.nn.EmbeddingOptions`, or a mapping of its fields).
        pooling: pooling mode, projection head and normalisation (:class:`PoolingOptions`).
        max_len: learned positions: the table's rows (``max_position_embeddings``, offset
            included), longer inputs raise; RoPE: the precomputed table (extended on demand).
        positions: "rope" (in attention) or "learned" (an absolute table added to the tokens).
        rope_base: RoPE's wavelength base.
        causal: causal self-attention (a CLIP-style text tower, pooled at the last token).
        pretrained: an mmtf export of such an encoder (weights.safetensors + config.yaml);
            Hugging Face folders are read by :func:`mmtf.pretrained.bert.bert_encoder`.
        freeze: frozen and in eval mode after loading.
    """

    # Pooling "cls" reads the tokenizer's first token ([CLS], <s>, <bos>); "mean" counts every
    # valid token, the specials included (no prefix is skipped).
    has_cls = True
    num_prefix_tokens = 0

    def __init__(self, *, vocab_size: int, dim: int = 128, depth: int = 4, num_heads: int = 4,
                 block: BlockOptions | Mapping[str, Any] | None = None,
                 embedding: EmbeddingOptions | Mapping[str, Any] | None = None,
                 pooling: PoolingOptions | Mapping[str, Any] | None = None,
                 max_len: int = 512, positions: PositionKind = "rope",
                 rope_base: float = 10000.0, final_norm: bool = True, causal: bool = False,
                 activation_checkpointing: bool = False, pretrained: str | Path | None = None,
                 freeze: bool = False) -> None:
        super().__init__()
        block = as_part(BlockOptions, block)
        embedding = as_part(EmbeddingOptions, embedding)
        pooling = as_part(PoolingOptions, pooling)
        self.config = record_config({**locals(), **asdict(block), **asdict(embedding),
                                     **asdict(pooling)})
        if positions not in ("rope", "learned"):
            raise UserError(f"TextEncoder: positions ({positions!r}) must be 'rope' or "
                            f"'learned'; fix {NODE}.positions.")
        if max_len < 1:
            raise UserError(f"TextEncoder: max_len ({max_len}) must be >= 1; fix "
                            f"{NODE}.max_len.")
        if positions == "rope" and embedding.position_offset:
            raise UserError(f"TextEncoder: {NODE}.embedding.position_offset "
                            f"({embedding.position_offset}) offsets a learned table; with "
                            f"positions: rope set it to 0.")
        self.dim, self.vocab_size, self.max_len = dim, vocab_size, max_len
        self.causal = causal
        with in_config(NODE):
            self.embedding = TokenEmbedding(
                vocab_size=vocab_size, dim=dim,
                max_positions=max_len if positions == "learned" else None, options=embedding,
                norm=block.norm, norm_eps=block.norm_eps, dropout=block.dropout)
            self.stack = TransformerStack(
                depth=depth, dim=dim, num_heads=num_heads, block=block, causal=causal,
                rope=positions == "rope", rope_base=rope_base, max_len=max_len,
                final_norm=final_norm, activation_checkpointing=activation_checkpointing)
        self.pooling = pooling
        self.head, self.embed_dim = projection_head(dim, pooling)
        # A causal text tower is a model of its own (CLIP), not a research switch: no warning.
        self._finish_init(pretrained=pretrained, freeze=freeze, causal=False)

    @property
    def max_tokens(self) -> int:
        """The longest token sequence the encoder reads (the tokenizer's truncation)."""
        limit = self.embedding.max_tokens
        return self.max_len if limit is None else limit

    def forward(self, inputs: Tensor, mask: Tensor | None = None, *,
                token_type_ids: Tensor | None = None,
                attention_layers: AttentionLayers | None = None,
                ) -> EncoderOutput | tuple[EncoderOutput, AttentionMaps]:
        """Encode a batch of token ids.

        Args:
            inputs: (b, n) long token ids.
            mask: (b, n) bool or 0/1, True = a real token; or (b,) lengths (right padding);
                None = every token real.
            token_type_ids: (b, n) long segment ids (BERT's sentence pairs); None = type 0.
            attention_layers: ``{"self": [layers]}`` whose attention probabilities to return
                (:meth:`mmtf.nn.TransformerStack.forward`).

        Returns:
            EncoderOutput: memory (b, n, c), zeros at padding; mask (b, n) bool. With
            ``attention_layers`` also ``{"self": {layer: (b, h, n, n)}}``.
        """
        key_mask = self._key_mask(inputs, mask)                          # (b, n) or None
        x = self.embedding(inputs, key_mask, token_type_ids)              # (b, n, c)
        rope_positions = None
        if (self.stack.rope is not None and key_mask is not None
                and self.embedding.options.positions_from_mask):
            rope_positions = (key_mask.long().cumsum(dim=1) - 1).clamp_min(0)  # (b, n)
        out = self.stack(x, key_mask=key_mask, positions=rope_positions,
                         attention_layers=attention_layers)
        maps = None
        if attention_layers is not None:
            out, maps = out
        if key_mask is None:
            key_mask = torch.ones(inputs.shape, dtype=torch.bool, device=inputs.device)
        else:
            out = out.masked_fill(~key_mask[..., None], 0.0)
        result = EncoderOutput(out, key_mask)
        return result if maps is None else (result, maps)

    def embed(self, inputs: Tensor, mask: Tensor | None = None, *,
              token_type_ids: Tensor | None = None, normalize: bool | None = None) -> Tensor:
        """One embedding per text: the states pooled (``pooling.mode``), projected by the head
        and L2-normalised when ``normalize`` (default ``pooling.normalize``) is true.

        Args:
            inputs, mask, token_type_ids: as :meth:`forward`.

        Returns:
            (b, e).
        """
        out = self(inputs, mask, token_type_ids=token_type_ids)
        vectors = self.head(pool(out.memory, out.mask, self.pooling.mode))   # (b, e)
        normalize = self.pooling.normalize if normalize is None else normalize
        return F.normalize(vectors, dim=-1) if normalize else vectors

    def _key_mask(self, inputs: Tensor, mask: Tensor | None) -> Tensor | None:
        """The (b, n) bool mask of real tokens; None when every token is real (the attention
        then builds no mask at all)."""
        if inputs.dim() != 2 or inputs.dtype != torch.long:
            raise ValueError(f"TextEncoder: inputs must be (batch, tokens) long ids, got "
                             f"{inputs.dtype} {tuple(inputs.shape)}.")
        if mask is None:
            return None
        b, n = inputs.shape
        mask = mask.to(inputs.device)
        if mask.dim() == 1 and mask.shape[0] == b and not mask.dtype.is_floating_point:
            mask = torch.arange(n, device=inputs.device) < mask[:, None]     # lengths
        if mask.shape != inputs.shape:
            raise ValueError(f"TextEncoder: mask must be (batch={b}, tokens={n}) or (batch,) "
                             f"lengths, got {tuple(mask.shape)}.")
        mask = mask.bool()
        return None if bool(mask.all()) else mask


def projection_head(dim: int, pooling: PoolingOptions) -> tuple[nn.Module, int]:
    """The head after pooling and the embedding width it gives (:class:`PoolingOptions`).

    Raises:
        UserError: an unknown mode or head, or an ``embed_dim`` that does not fit the head.
    """
    if pooling.mode not in POOL_MODES:
        raise UserError(f"TextEncoder: {NODE}.pooling.mode ({pooling.mode!r}) must be one of "
                        f"{', '.join(POOL_MODES)}.")
    if pooling.head not in HEAD_KINDS:
        raise UserError(f"TextEncoder: {NODE}.pooling.head ({pooling.head!r}) must be one of "
                        f"{', '.join(HEAD_KINDS)}.")
    embed_dim = pooling.embed_dim
    if pooling.head == "none":
        if embed_dim not in (None, dim):
            raise UserError(f"TextEncoder: {NODE}.pooling.embed_dim ({embed_dim}) differs from "
                            f"dim ({dim}) but pooling.head is none; set head: linear or mlp, or "
                            f"embed_dim: null.")
        return nn.Identity(), dim
    if embed_dim is None or embed_dim < 1:
        raise UserError(f"TextEncoder: {NODE}.pooling.head {pooling.head} needs "
                        f"pooling.embed_dim (>= 1), got {embed_dim}.")
    head = projection(pooling.head, dim, embed_dim, pooling.head_hidden, bias=False,
                      owner="TextEncoder", key=f"{NODE}.pooling.head",
                      out_key=f"{NODE}.pooling.embed_dim")
    return head, embed_dim


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str], *, max_len: int | None = None,
                 parse_specials: bool = False, device: torch.device | str | None = None,
                 ) -> tuple[Tensor, Tensor]:
    """Right-padded ids and mask of ``texts``, each as the tokenizer wraps it (``[*prompt_ids,
    ..., eos]``: BERT's ``[CLS] .. [SEP]``, RoBERTa's ``<s> .. </s>``, mmtf's ``<bos> ..
    <eos>``) and cut to ``max_len`` ids with the end token kept.

    Args:
        parse_specials: a special token spelled in the text (``[MASK]``) is that token, as
            transformers reads it; False (mmtf's rule for its own text) encodes it as text.

    Returns:
        ids (b, n) long (padding ``tokenizer.pad_id``) and mask (b, n) bool, True = a token.
    """
    backend = getattr(tokenizer, "backend", None) if parse_specials else None
    previous = None if backend is None else backend.encode_special_tokens
    if backend is not None:
        backend.encode_special_tokens = False
    try:
        rows = tokenizer.encode_batch(list(texts), add_special=True, max_len=max_len)
    finally:
        if backend is not None:
            backend.encode_special_tokens = previous
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, :len(row)] = True
    return ids.to(device), mask.to(device)


class TextEmbedder(nn.Module):
    """A :class:`TextEncoder` with its tokenizer: strings in, embeddings out.

    Args:
        encoder: the encoder (its pooling, head and normalisation are the embedding's).
        tokenizer: the tokenizer it was trained with.
        max_len: the most tokens per text, specials included; None = what the encoder reads.
        lowercase: lower-case each text first (sentence-transformers' ``do_lower_case``).
        parse_specials: special tokens spelled in a text are those tokens (as transformers
            reads text; :func:`encode_texts`).
    """

    modality = "text"

    def __init__(self, encoder: TextEncoder, tokenizer: Tokenizer, *, max_len: int | None = None,
                 lowercase: bool = False, parse_specials: bool = False) -> None:
        super().__init__()
        self.encoder, self.tokenizer, self.lowercase = encoder, tokenizer, lowercase
        self.parse_specials = parse_specials
        self.max_len = encoder.max_tokens if max_len is None else min(max_len, encoder.max_tokens)

    @property
    def embed_dim(self) -> int:
        return self.encoder.embed_dim

    def encode_texts(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Ids (b, n) and mask (b, n) of ``texts`` on the encoder's device (:func:`encode_texts`)."""
        if self.lowercase:
            texts = [t.lower() for t in texts]
        return encode_texts(self.tokenizer, texts, max_len=self.max_len,
                            parse_specials=self.parse_specials, device=self.device)

    @property
    def device(self) -> torch.device:
        return self.encoder.embedding.tokens.weight.device

    @torch.no_grad()
    def embed_text(self, texts: Sequence[str] | str, *, batch_size: int = 32,
                   normalize: bool | None = None) -> Tensor:
        """The embedding of each text, (n, e), in the order given.

        Texts are batched by length (less padding; the result does not depend on it).

        Args:
            texts: strings (one string alone is a list of one).
            batch_size: texts per forward pass.
            normalize: L2-normalise; None = the encoder's ``pooling.normalize``.

        Raises:
            UserError: an item that is not a string, or a batch size < 1.
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise UserError(f"embed_text: item {i} is a {type(text).__name__}, not a "
                                f"string.")
        if batch_size < 1:
            raise UserError(f"embed_text: batch_size ({batch_size}) must be >= 1.")
        if not texts:
            return torch.zeros(0, self.embed_dim, device=self.device)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out: list[Tensor] = []
        for start in range(0, len(texts), batch_size):
            ids, mask = self.encode_texts([texts[i] for i in order[start:start + batch_size]])
            out.append(self.encoder.embed(ids, mask, normalize=normalize))   # (batch, e)
        vectors = torch.cat(out)                                             # (n, e), sorted
        return vectors[torch.argsort(torch.tensor(order, device=vectors.device))]


__all__ = ["PoolingOptions", "TextEmbedder", "TextEncoder", "encode_texts", "projection_head"]
