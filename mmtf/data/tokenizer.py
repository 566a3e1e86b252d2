"""Build the caption tokenizer from a plain config dict (the data module's ``tokenizer`` arg)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mmtf.utils.config import ConfigError

TOKENIZER_KINDS = ("bpe", "char")


def build_tokenizer(spec: Mapping[str, Any], texts: Iterable[str]) -> Any:
    """Train a tokenizer of ``mmtf.text`` on ``texts``.

    Args:
        spec: ``{"kind": "bpe" | "char", **training kwargs}``, e.g. ``{kind: bpe,
            vocab_size: 1000, lowercase: true}``. A ``max_len`` key is allowed and ignored here
            (it is the data module's caption length limit, not a training option).
        texts: the training captions (every reference of every training item).

    Returns:
        A trained ``mmtf.text.Tokenizer``.

    Raises:
        ConfigError: unknown ``kind`` (or a training option the tokenizer rejects).
    """
    from mmtf.text import BPETokenizer, CharTokenizer

    spec = dict(spec)
    kind = spec.pop("kind", "bpe")
    spec.pop("max_len", None)
    classes = {"bpe": BPETokenizer, "char": CharTokenizer}
    if kind not in classes:
        raise ConfigError(f"tokenizer kind ({kind!r}) must be one of {TOKENIZER_KINDS}; set "
                          f"data.tokenizer.kind=bpe or char.")
    try:
        return classes[kind].train(list(texts), **spec)
    except TypeError as e:
        raise ConfigError(f"data.tokenizer: {kind} tokenizer rejected the options "
                          f"{sorted(spec)} ({e}); check the keys under data.tokenizer.") from None
