"""The prefix a decoder starts from, built here only: training targets, generation, predict
and the zero-shot Whisper ask a :class:`Prompt` for the ids of an item's speech ``job``
(``transcribe`` | ``translate``), ``language``, mixture ``source`` and ``timestamps``.

A chat template is one more subclass; :func:`prompt_for` picks the kind a tokenizer calls
for. Why: docs/design/prompt-and-special-tokens.md

Shapes: ids are python ``list[int]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmtf.errors import ConfigError, UserError
from mmtf.text.base import Tokenizer

JOBS = ("transcribe", "translate")
# Whisper's speech tokens (whisper/tokenizer.py).
START_OF_TRANSCRIPT = "<|startoftranscript|>"
NO_TIMESTAMPS = "<|notimestamps|>"
FIRST_TIMESTAMP = "<|0.00|>"


class Prompt:
    """The tokenizer's own prompt (:attr:`Tokenizer.prompt_ids`), whatever an item asks for."""

    speech = False      # whether ``job`` and ``language`` change the ids

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @property
    def default(self) -> list[int]:
        """The prefix of an item that asks for nothing; every encoding starts with it."""
        return self.tokenizer.prompt_ids

    def ids(self, *, job: str | None = None, language: str | None = None,
            source: str | None = None, timestamps: bool | None = None,
            where: str | None = None) -> list[int]:
        """The prefix ids of an item.

        Args:
            job, language, timestamps: ``transcribe`` | ``translate``, a language code, whether
                timestamps are generated; None = as the default prompt.
            source: a mixture source's name (:class:`SourcePrompt`).
            where: the data item named in errors; None = a ``generation.*`` setting.
        """
        return self.default

    def start(self, ids: Sequence[Sequence[int]], prefix: Sequence[int],
              where: str = "") -> list[list[int]]:
        """Encoded targets (each starting with :attr:`default`) that start with ``prefix``.

        Raises:
            ConfigError: ``prefix`` is not as long as the default prompt (the loss skips
                that many positions).
        """
        default = self.default
        if len(prefix) != len(default):
            tok = self.tokenizer
            raise ConfigError(
                f"{where}: the item's prompt {[tok.id_to_token(i) for i in prefix]} is not as "
                f"long as tokenizer.prompt {[tok.id_to_token(i) for i in default]}; write "
                f"tokenizer.prompt in the same form (e.g. {START_OF_TRANSCRIPT} <|en|> "
                f"<|transcribe|> {NO_TIMESTAMPS}).")
        return [[*prefix, *t[len(default):]] for t in ids]


class WhisperPrompt(Prompt):
    """Whisper's prompt, from the vocabulary facts of a :class:`PretrainedTokenizer`."""

    speech = True

    def default_language(self) -> str | None:
        """The language of the configured prompt, else English; None on an English-only model."""
        tok = self.tokenizer
        if not tok.multilingual:
            return None
        codes = {i: code for code, i in tok.languages.items()}
        return next((codes[i] for i in self.default if i in codes), "en")

    def ids(self, *, job: str | None = None, language: str | None = None,
            source: str | None = None, timestamps: bool | None = None,
            where: str | None = None) -> list[int]:
        tok = self.tokenizer
        if language is None:
            language = self.default_language()
        elif where is not None and tok.multilingual and language not in tok.languages:
            raise ConfigError(f"{where}: unknown language code {language!r}; the model's "
                              f"languages are {sorted(tok.languages)}.")
        if timestamps is None:
            # As the configured prompt: no <|notimestamps|> in it (and a vocabulary with
            # timestamp tokens) means the targets carry timestamps.
            timestamps = tok.no_timestamps_id not in self.default and \
                tok.timestamp_begin is not None
        return self.build(language, job or "transcribe", timestamps=timestamps)

    def build(self, language: str | None = "en", job: str = "transcribe",
              timestamps: bool = False) -> list[int]:
        """``<|startoftranscript|> <|lang|> <|job|>``, then ``<|notimestamps|>`` unless
        ``timestamps``; English-only models: no language and job.

        Raises:
            UserError: an unknown language or job, a model without Whisper's prompt tokens,
                or timestamps on a vocabulary without timestamp tokens.
        """
        tok = self.tokenizer
        sot = tok.start_of_transcript_id
        if sot is None:
            raise UserError(f"tokenizer ({tok.source}): no {START_OF_TRANSCRIPT} token; "
                            f"generation.language and generation.task need a Whisper "
                            f"vocabulary.")
        prompt = [sot]
        if tok.multilingual:
            prompt += [self.language_id(language), self.job_id(job)]
        elif job != "transcribe" or language not in (None, "en"):
            raise UserError(f"tokenizer ({tok.source}): an English-only model transcribes "
                            f"English only; got language={language!r}, task={job!r} "
                            f"(use language=en, task=transcribe, or a multilingual model).")
        if timestamps:
            if tok.timestamp_begin is None:
                raise UserError(f"generation.timestamps=true: the tokenizer ({tok.source}) has "
                                f"no timestamp tokens ({FIRST_TIMESTAMP} ..); set "
                                f"generation.timestamps=false.")
        else:
            if tok.no_timestamps_id is None:
                raise UserError(f"tokenizer ({tok.source}): no {NO_TIMESTAMPS} token; not a "
                                f"Whisper vocabulary.")
            prompt.append(tok.no_timestamps_id)
        return prompt

    def language_id(self, language: str | None) -> int:
        """The token id of a language code; a one-line error listing the model's codes."""
        languages = self.tokenizer.languages
        found = languages.get(str(language).lower()) if language is not None else None
        if found is None:
            codes = " ".join(languages) or "none"
            raise UserError(f"generation.language={language!r} is not a language of this model "
                            f"({self.tokenizer.source}); its codes: {codes} (or auto to detect "
                            f"it).")
        return found

    def job_id(self, job: str) -> int:
        """The token id of ``transcribe`` / ``translate``."""
        jobs = self.tokenizer.task_ids
        if job not in jobs:
            raise UserError(f"generation.task={job!r} is not a task of this model "
                            f"({self.tokenizer.source}); its tasks: {' '.join(jobs) or 'none'}.")
        return jobs[job]

    def token_strings(self) -> list[str]:
        """The zero-shot prompt as token strings (``tokenizer.prompt``): English transcription
        without timestamps."""
        return [self.tokenizer.id_to_token(i) for i in self.build(self.default_language())]


class SourcePrompt(Prompt):
    """A mixture's prompt: ``inner``'s ids with the last place holding the source's token
    (``tokens``: source name -> id; sources without one keep ``inner``'s)."""

    def __init__(self, inner: Prompt, tokens: Mapping[str, int]) -> None:
        super().__init__(inner.tokenizer)
        self.inner, self.tokens = inner, dict(tokens)
        self.speech = inner.speech

    def ids(self, *, source: str | None = None, **asked: Any) -> list[int]:
        return self.mark(self.inner.ids(**asked), source)

    def mark(self, ids: Sequence[int], source: str | None) -> list[int]:
        """``ids`` (a target or a prefix) with the source's token in the prompt's last place."""
        if source not in self.tokens:
            return list(ids)
        p = len(self.default)
        return [*ids[:p - 1], self.tokens[source], *ids[p:]]


def is_whisper(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` is a Whisper vocabulary (it has ``<|startoftranscript|>``)."""
    return getattr(tokenizer, "start_of_transcript_id", None) is not None


def prompt_for(tokenizer: Tokenizer) -> Prompt:
    """The kind of prompt ``tokenizer`` calls for: Whisper's with a Whisper vocabulary, else its
    own fixed prompt."""
    return WhisperPrompt(tokenizer) if is_whisper(tokenizer) else Prompt(tokenizer)


__all__ = ["JOBS", "Prompt", "SourcePrompt", "WhisperPrompt", "is_whisper", "prompt_for"]
