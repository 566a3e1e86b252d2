"""Build the caption tokenizer from a plain config dict (the data module's ``tokenizer`` arg):
train one of mmtf's own, or read a pretrained model's (never trained)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mmtf.errors import ConfigError

TOKENIZER_KINDS = ("bpe", "char", "pretrained")


def build_tokenizer(spec: Mapping[str, Any], texts: Iterable[str]) -> Any:
    """Train a tokenizer of ``mmtf.text`` on ``texts``, or read a pretrained one.

    Args:
        spec: ``{"kind": "bpe" | "char", **training kwargs}``, e.g. ``{kind: bpe,
            vocab_size: 1000, lowercase: true}``; or ``{kind: pretrained, path: <model folder or
            hub id>, prompt: [token, ...] | null}`` (``texts`` unused; other keys must be
            null). A ``max_len`` key is
            allowed and ignored here (it is the data module's caption length limit, not a
            training option).
        texts: the training captions (every reference of every training item).

    Returns:
        A trained ``mmtf.text.Tokenizer``.

    Raises:
        ConfigError: unknown ``kind`` (or a training option the tokenizer rejects).
    """
    from mmtf.text import BPETokenizer, CharTokenizer, PretrainedTokenizer

    spec = dict(spec)
    kind = spec.pop("kind", "bpe")
    spec.pop("max_len", None)
    if kind == "pretrained":
        # Keys of mmtf's trainable tokenizers may be present (inherited from a data config)
        # but must be null: a pretrained vocabulary is never retrained.
        unknown = sorted(k for k, v in spec.items() if k not in ("path", "prompt") and v is not None)
        if unknown or not spec.get("path"):
            raise ConfigError(f"data.tokenizer (kind: pretrained) takes path (a model folder or "
                              f"hub id) and prompt (token strings or null); got {unknown or 'no path'}"
                              f"; set the other keys to null.")
        prompt = spec.get("prompt")
        return PretrainedTokenizer.from_folder(
            spec["path"], prompt=None if prompt is None else [str(t) for t in prompt])
    classes = {"bpe": BPETokenizer, "char": CharTokenizer}
    if kind not in classes:
        raise ConfigError(f"tokenizer kind ({kind!r}) must be one of {TOKENIZER_KINDS}; set "
                          f"data.tokenizer.kind=bpe, char or pretrained.")
    try:
        return classes[kind].train(list(texts), **spec)
    except TypeError as e:
        raise ConfigError(f"data.tokenizer: {kind} tokenizer rejected the options "
                          f"{sorted(spec)} ({e}); check the keys under data.tokenizer.") from None
