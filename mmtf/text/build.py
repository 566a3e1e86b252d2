"""Build a caption tokenizer from the ``tokenizer`` config node: train one of mmtf's own on
captions, read a pretrained model's, or load one saved by :meth:`Tokenizer.save`.

Only :func:`mmtf.tasks.resolve_tokenizer` calls this for a run (it also knows resumed
checkpoints); why: see docs/design/tokenizer-ownership.md
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mmtf.errors import ConfigError
from mmtf.text.base import Tokenizer, load_tokenizer
from mmtf.text.bpe import BPETokenizer
from mmtf.text.char import CharTokenizer
from mmtf.text.pretrained import PretrainedTokenizer

log = logging.getLogger("mmtf.text")

TRAINED = {"bpe": BPETokenizer, "char": CharTokenizer}
TOKENIZER_KINDS = (*TRAINED, "pretrained", "saved")
# The keys each kind that is not trained takes; training options of TRAINED kinds are ignored
# there (an experiment may set tokenizer.vocab_size for its decoder size).
_READ_KEYS = {"pretrained": ("path", "prompt"), "saved": ("path",)}
_TRAINING_KEYS = ("vocab_size", "lowercase", "strip_punctuation", "min_frequency",
                  "special_tokens")


def trains(spec: Mapping[str, Any]) -> bool:
    """Whether ``spec`` trains a tokenizer (on the train split's captions)."""
    return spec.get("kind", "bpe") in TRAINED


def build_tokenizer(spec: Mapping[str, Any],
                    train_texts: Callable[[], Iterable[str]] | None = None) -> Tokenizer:
    """The tokenizer ``spec`` describes.

    Args:
        spec: the ``tokenizer`` config node (``conf/tokenizer/``): ``kind`` (bpe | char |
            pretrained | saved) and that kind's keys.
        train_texts: returns the training captions; called only for the kinds that train.

    Raises:
        ConfigError: an unknown kind or key, no ``train_texts`` to train on, or a training
            option the tokenizer rejects.
    """
    spec = dict(spec)
    kind = spec.pop("kind", None) or "bpe"
    if kind in _READ_KEYS:
        return _read(kind, spec)
    if kind not in TRAINED:
        raise ConfigError(f"tokenizer.kind ({kind!r}) must be one of {TOKENIZER_KINDS}; select "
                          f"one with tokenizer=bpe | char | pretrained | saved.")
    if train_texts is None:
        raise ConfigError(f"tokenizer.kind={kind} trains on the train split's captions, but "
                          f"none were given; pass train_texts (or use tokenizer=saved).")
    texts = list(train_texts())
    try:
        tokenizer = TRAINED[kind].train(texts, **spec)
    except TypeError as e:
        raise ConfigError(f"tokenizer: the {kind} tokenizer rejected the options {sorted(spec)} "
                          f"({e}); check the keys under tokenizer (conf/tokenizer/{kind}.yaml)."
                          ) from None
    log.info("[text] trained a %s tokenizer on %d training captions: %d tokens", kind,
             len(texts), tokenizer.vocab_size)
    return tokenizer


def _read(kind: str, spec: dict[str, Any]) -> Tokenizer:
    takes = _READ_KEYS[kind]
    unknown = sorted(k for k in spec if k not in takes and k not in _TRAINING_KEYS)
    if unknown:
        raise ConfigError(f"tokenizer (kind: {kind}) takes {list(takes)}; got {unknown}; remove "
                          f"them (conf/tokenizer/{kind}.yaml).")
    unused = sorted(k for k in spec if k in _TRAINING_KEYS and spec[k] is not None)
    if unused:
        log.info("[text] tokenizer (kind: %s) is not trained: %s unused", kind, unused)
    path = spec.get("path")
    if not path:
        fix = ("set pretrained=<model folder or hub id> or tokenizer.path=" if kind == "pretrained"
               else "set tokenizer.path=<the tokenizer JSON>")
        raise ConfigError(f"tokenizer.path is {path!r} (kind: {kind}); {fix}.")
    if kind == "saved":
        return load_tokenizer(path)
    prompt = spec.get("prompt")
    return PretrainedTokenizer.from_folder(
        path, prompt=None if prompt is None else [str(t) for t in prompt])
