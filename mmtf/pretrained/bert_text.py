"""Zero-shot use of a pretrained text-encoder folder: strings in, sentence embeddings out.

:class:`PretrainedTextEncoder` is a :class:`~mmtf.encoders.text.TextEmbedder` read from a
BERT / RoBERTa / XLM-RoBERTa folder or a sentence-transformers folder of one: the encoder
(:func:`~mmtf.pretrained.bert.bert_encoder`, with the folder's pooling and normalisation), the
folder's ``tokenizer.json`` (``[CLS] .. [SEP]`` / ``<s> .. </s>``, special tokens spelled in the
text read as transformers reads them) and its truncation: sentence-transformers'
``max_seq_length``, else the tokenizer's ``model_max_length``, never past the model's positions.
``mmtf.load(<folder>)`` returns one; ``embed_text`` gives the folder's sentence embeddings.
Why: docs/design/text-encoders.md.

Shapes: n texts, e = the embedding width.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from mmtf.encoders.text import TextEmbedder, TextEncoder
from mmtf.errors import UserError
from mmtf.hub import resolve_source
from mmtf.pretrained.bert import bert_encoder, folder_settings, is_text_encoder_folder
from mmtf.text import PretrainedTokenizer

TOKENIZER_CONFIG = "tokenizer_config.json"


class PretrainedTextEncoder(TextEmbedder):
    """A pretrained text encoder with its tokenizer, for sentence embeddings.

    Args:
        encoder, tokenizer, max_len, lowercase: as :class:`TextEmbedder` (special tokens
            spelled in a text are those tokens, as in transformers).
        folder: the folder it was read from.
    """

    def __init__(self, encoder: TextEncoder, tokenizer: PretrainedTokenizer, *,
                 max_len: int | None = None, lowercase: bool = False,
                 folder: Path | None = None) -> None:
        super().__init__(encoder, tokenizer, max_len=max_len, lowercase=lowercase,
                         parse_specials=True)
        self.folder = folder
        self.run_config = {"pretrained": None if folder is None else str(folder)}

    @classmethod
    def from_folder(cls, source: str | Path) -> PretrainedTextEncoder:
        """Read a text-encoder folder or hub id (weights, pooling, tokenizer, truncation).

        Raises:
            UserError: an unsupported family (named with the supported list), an unsupported
                sentence-transformers module, a missing ``tokenizer.json``, or weights that do
                not match ``config.json``.
        """
        folder = resolve_source(source, owner=f"ckpt_path={source}")
        settings = folder_settings(folder)
        encoder = bert_encoder(pretrained=folder).eval()
        tokenizer = PretrainedTokenizer.from_folder(settings.model_folder)
        max_len = settings.max_seq_length or _model_max_length(settings.model_folder)
        return cls(encoder, tokenizer, max_len=max_len, lowercase=settings.lowercase,
                   folder=folder)

    # ------------------------------------------------------------------ what mmtf.load asks
    def update_generation(self, overrides: Mapping[str, Any]) -> None:
        """A text encoder generates nothing: generation settings are refused."""
        if overrides:
            raise UserError(f"mmtf.load: {sorted(overrides)} are generation settings, and a "
                            f"text encoder generates nothing; drop them (embed_text takes "
                            f"batch_size and normalize).")

    def generation_state(self) -> Any:
        return {}

    def restore_generation(self, state: Any) -> None:
        return None

    def export_parts(self) -> dict[str, nn.Module]:
        return {"encoder": self.encoder}


def _model_max_length(folder: Path) -> int | None:
    """``tokenizer_config.json``'s ``model_max_length``; None when absent or transformers'
    "no limit" placeholder (1e30)."""
    path = folder / TOKENIZER_CONFIG
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("model_max_length")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    return int(value) if isinstance(value, (int, float)) and 0 < value < 10**9 else None


__all__ = ["PretrainedTextEncoder", "is_text_encoder_folder"]
