"""Text normalizers applied before word/character error rates (``model.wer_normalizer``):
``whisper_english`` and ``whisper_basic`` are openai/whisper's ``EnglishTextNormalizer`` and
``BasicTextNormalizer`` from the ``whisper-normalizer`` package (MIT), ``none`` keeps the text.
Why: docs/design/asr-normalizers.md."""

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
