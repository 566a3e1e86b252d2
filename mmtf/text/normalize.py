"""Text normalizers applied before word/character error rates: Whisper's English and basic rules.

A WER is only comparable with Whisper's published numbers under the same normalisation. By name
(``model.wer_normalizer``):

* ``whisper_english``: Whisper's ``EnglishTextNormalizer`` (lower case; bracketed spans and
  fillers removed; contractions and titles expanded; spelled-out numbers to digits; British
  spellings to American; symbols and diacritics removed).
* ``whisper_basic``: Whisper's ``BasicTextNormalizer``, for any language (lower case, bracketed
  spans removed, marks, symbols and punctuation to spaces, diacritics kept).
* ``none``: the text as it is.

The rules are openai/whisper's own, from the ``whisper-normalizer`` package (a copy of
``whisper/normalizers``, MIT); tests/unit/text/test_normalize.py checks them against Whisper's
test cases and transformers' copies. Why: docs/design/asr-normalizers.md.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from mmtf.errors import ConfigError

NORMALIZERS: tuple[str, ...] = ("whisper_english", "whisper_basic", "none")


def _identity(text: str) -> str:
    return text


@cache
def get_normalizer(name: str) -> Callable[[str], str]:
    """The normalizer called ``name`` (one of :data:`NORMALIZERS`).

    Raises:
        ConfigError: an unknown name; the message lists the choices.
    """
    if name == "whisper_english":
        from whisper_normalizer.english import EnglishTextNormalizer

        return EnglishTextNormalizer()
    if name == "whisper_basic":
        from whisper_normalizer.basic import BasicTextNormalizer

        return BasicTextNormalizer()
    if name == "none":
        return _identity
    raise ConfigError(f"model.wer_normalizer ({name!r}) must be one of {list(NORMALIZERS)}: "
                      f"whisper_english (English: numbers, spellings, contractions), "
                      f"whisper_basic (any language: symbols removed) or none.")
