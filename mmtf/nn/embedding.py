"""Token ids to vectors before the first block: the word table, learned absolute positions,
token types and a norm over their sum.

BERT-family encoders sum a word, a learned position and a token-type (segment) vector per token
and normalise the sum (LayerNorm) before the first post-norm block; RoBERTa's position table
starts at ``padding_idx + 1`` and counts real tokens only. mmtf's own text models use the word
table alone and RoPE in attention. Why these live in the core: docs/design/text-encoders.md.

Shapes: b batch, n tokens, c = dim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from mmtf.errors import UserError
from mmtf.nn.positions import LearnedPositions
from mmtf.nn.transformer import NormKind, active_dropout, make_norm
from mmtf.utils.parts import as_part


@dataclass(frozen=True)
class EmbeddingOptions:
    """How token ids become vectors (``model.text_encoder.embedding``).

    Args:
        type_vocab_size: token-type (segment) embeddings (BERT: 2, RoBERTa: 1); 0 = none.
            Where no type ids are given, every token is type 0 (as transformers does).
        position_offset: the first row of the learned position table a sequence uses
            (RoBERTa: ``padding_idx + 1`` = 2; BERT: 0).
        positions_from_mask: each row's positions count its real tokens only (RoBERTa's
            fairseq rule) instead of being the token index (BERT); the same for right padding.
        embed_norm: a norm (the blocks' kind and epsilon) over the summed embeddings (BERT).
    """

    type_vocab_size: int = 0
    position_offset: int = 0
    positions_from_mask: bool = False
    embed_norm: bool = False


class TokenEmbedding(nn.Module):
    """Word + position + token-type embeddings, then an optional norm and dropout.

    Args:
        vocab_size, dim: the word table.
        max_positions: rows of the learned position table (``max_position_embeddings``,
            ``position_offset`` included); None = no table (RoPE in attention).
        options: :class:`EmbeddingOptions` (or a mapping of its fields).
        norm, norm_eps: the kind and epsilon of ``embed_norm``.
        dropout: after the norm (BERT's ``hidden_dropout_prob``).
        init_std: the normal initialisation of every table (BERT's 0.02).
    """

    def __init__(self, *, vocab_size: int, dim: int, max_positions: int | None = None,
                 options: EmbeddingOptions | Mapping[str, Any] | None = None,
                 norm: NormKind = "layernorm", norm_eps: float = 1e-5, dropout: float = 0.0,
                 init_std: float = 0.02) -> None:
        super().__init__()
        o = as_part(EmbeddingOptions, options)
        if vocab_size < 1 or dim < 1:
            raise UserError(f"TokenEmbedding: vocab_size ({vocab_size}) and dim ({dim}) must be "
                            f">= 1.")
        if o.type_vocab_size < 0 or o.position_offset < 0:
            raise UserError(f"TokenEmbedding: type_vocab_size ({o.type_vocab_size}) and "
                            f"position_offset ({o.position_offset}) must be >= 0.")
        if max_positions is not None and o.position_offset >= max_positions:
            raise UserError(f"TokenEmbedding: position_offset ({o.position_offset}) leaves no "
                            f"row of the {max_positions}-row position table; raise max_len.")
        self.options = o
        self.tokens = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.tokens.weight, std=init_std)
        self.positions = (None if max_positions is None
                          else LearnedPositions(max_positions, dim, init_std=init_std))
        self.token_types = None
        if o.type_vocab_size:
            self.token_types = nn.Embedding(o.type_vocab_size, dim)
            nn.init.normal_(self.token_types.weight, std=init_std)
        self.norm = make_norm(norm, dim, norm_eps) if o.embed_norm else None
        self.drop = nn.Dropout(dropout)

    @property
    def max_tokens(self) -> int | None:
        """The longest sequence the position table holds (None: no table, no limit here)."""
        if self.positions is None:
            return None
        return self.positions.num_positions - self.options.position_offset

    def forward(self, input_ids: Tensor, mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        """Args:
            input_ids: (b, n) long.
            mask: (b, n) bool, True = a real token (read by ``positions_from_mask`` only).
            token_type_ids: (b, n) long segment ids, or None (all type 0).

        Returns:
            (b, n, c).

        Raises:
            UserError: more tokens than the position table holds, or type ids for a model
                without token types.
        """
        x = self.tokens(input_ids)                                           # (b, n, c)
        n = input_ids.shape[1]
        if self.positions is not None:
            offset = self.options.position_offset
            rows = None
            if self.options.positions_from_mask and mask is not None:
                # fairseq's make_positions: the k-th real token of a row sits at offset + k - 1
                # (a left pad's row is clamped to offset; its state is masked everywhere).
                rows = (mask.long().cumsum(dim=1) - 1).clamp_min(0) + offset  # (b, n)
            if n + offset > self.positions.num_positions:
                raise UserError(f"TokenEmbedding: {n} tokens exceed the {self.max_tokens} "
                                f"positions of the model; truncate the text (max_len).")
            x = x + self.positions(n, offset, rows)
        if self.token_types is not None:
            if token_type_ids is None:
                x = x + self.token_types.weight[0]
            else:
                x = x + self.token_types(token_type_ids)
        elif token_type_ids is not None:
            raise UserError("TokenEmbedding: token_type_ids given, but the model has no "
                            "token-type embeddings (type_vocab_size 0); drop them.")
        if self.norm is not None:
            x = self.norm(x)
        return active_dropout(self.drop, x)


__all__ = ["EmbeddingOptions", "TokenEmbedding"]
