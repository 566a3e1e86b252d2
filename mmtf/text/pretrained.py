"""A tokenizer imported from a Hugging Face ``tokenizer.json``, with the original's special ids.

:meth:`PretrainedTokenizer.from_folder` reads a model folder (or hub id): ``tokenizer.json`` as
is, the special tokens from ``tokenizer_config.json`` / ``special_tokens_map.json`` and ids from
``generation_config.json`` / ``config.json`` (eos and bos fall back to a BERT-family folder's
``sep_token`` and ``cls_token``, then pad and bos to eos; the prompt to
``[decoder_start_token_id]``, else ``[bos]``: ``encode`` then wraps a text as BERT's
``[CLS] .. [SEP]``). ``generation_config.json`` is kept whole for
``export format=hf``; the whole ``tokenizer.json`` is embedded in the JSON. Why:
docs/design/prompt-and-special-tokens.md.

Shapes: ids are python ``list[int]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from mmtf.errors import UserError, require_file
from mmtf.hub import resolve_source
from mmtf.text.base import BackedTokenizer
from mmtf.text.prompt import FIRST_TIMESTAMP, JOBS, NO_TIMESTAMPS, START_OF_TRANSCRIPT

TOKENIZER_FILE = "tokenizer.json"
# Read in this order; a later file fills only what the earlier ones left unset.
_TOKEN_FILES = ("tokenizer_config.json", "special_tokens_map.json")
_ID_FILES = ("generation_config.json", "config.json")
# A Whisper language token is <|code|> with a 2-3 letter code (haw, yue), which no other special
# token matches.
_LANGUAGE = re.compile(r"<\|([a-z]{2,3})\|>")
_TIMESTAMP = re.compile(r"<\|\d+\.\d\d\|>")


class PretrainedTokenizer(BackedTokenizer):
    """A `tokenizers.Tokenizer` with the special ids and prompt of the model it came with.

    Args:
        tokenizer: the loaded ``tokenizer.json``.
        pad_id, bos_id, eos_id: special ids (pad and bos may equal eos, as in GPT-2).
        unk_id: the unknown-token id, or None (byte-level BPE never needs one).
        prompt_ids: the decoder prompt; default ``[bos_id]``.
        source: where it was read from (for messages and the repr).
        multilingual: the model reads language and task tokens (False: Whisper's ``.en``).
        generation_config: the folder's ``generation_config.json`` (None: it had none, or the
            tokenizer was stored before mmtf kept it), written back by ``export format=hf``.

    Raises:
        UserError: an id is outside the vocabulary or the prompt is empty.
    """

    kind = "pretrained"
    _payload_keys = ("pad_id", "bos_id", "eos_id", "unk_id", "prompt_ids", "multilingual",
                     "generation_config")
    _payload_defaults = {"multilingual": True, "generation_config": None}

    def __init__(self, *, tokenizer: HFTokenizer, pad_id: int, bos_id: int, eos_id: int,
                 unk_id: int | None = None, prompt_ids: Sequence[int] | None = None,
                 source: str = "", multilingual: bool = True,
                 generation_config: Mapping[str, Any] | None = None) -> None:
        super().__init__(tokenizer)
        self.source = source
        self.multilingual = bool(multilingual)
        self.generation_config = None if generation_config is None else dict(generation_config)
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = pad_id, bos_id, eos_id, unk_id
        self._prompt = [int(i) for i in (prompt_ids if prompt_ids is not None else [bos_id])]
        if not self._prompt:
            raise UserError(f"PretrainedTokenizer ({source}): the prompt is empty; give at "
                            f"least one token (tokenizer.prompt).")
        ids = {"pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id, "unk_id": unk_id}
        for name, value in [*ids.items(), *(("prompt_ids", i) for i in self._prompt)]:
            if value is not None and not 0 <= value < self.vocab_size:
                raise UserError(f"PretrainedTokenizer ({source}): {name} ({value}) is outside "
                                f"the vocabulary [0, {self.vocab_size}).")
        # Whisper's tokenizer.json adds its timestamps as non-special tokens; they are never text.
        added = {i for i, t in tokenizer.get_added_tokens_decoder().items()
                 if t.special or _TIMESTAMP.fullmatch(t.content)}
        self._special = frozenset(added | {i for i in ids.values() if i is not None}
                                  | set(self._prompt))

    @classmethod
    def from_folder(cls, source: str | Path, *, prompt: Sequence[str] | None = None,
                    ) -> PretrainedTokenizer:
        """Read the tokenizer files of a model folder (or hub id); see the module docstring.

        Args:
            source: a folder holding ``tokenizer.json``, or a hub id (``openai/whisper-tiny``).
            prompt: the decoder prompt as token strings; None = the folder's default.

        Raises:
            UserError: ``tokenizer.json`` is missing or invalid, no eos token is named, or a
                named token is not in the vocabulary.
        """
        owner = "tokenizer (kind: pretrained)"
        folder = resolve_source(source, owner=owner)
        file = require_file(folder / TOKENIZER_FILE, what=f"{owner}: {TOKENIZER_FILE}",
                            fix="save the tokenizer with save_pretrained beside the model")
        try:
            tok = HFTokenizer.from_file(str(file))
        except Exception as err:  # the Rust side raises its own exception type
            raise UserError(f"{owner}: {file} is not a tokenizers JSON ({err}).") from None
        tokens = _merged(folder, _TOKEN_FILES, owner)
        numbers = _merged(folder, _ID_FILES, owner)

        def token_id(name: str) -> int | None:
            text = _token_text(tokens.get(name))
            if text is not None:
                found = tok.token_to_id(text)
                if found is None:
                    raise UserError(f"{owner}: {name} {text!r} of {folder} is not in "
                                    f"{file.name}'s vocabulary.")
                return found
            value = numbers.get(f"{name}_id")
            return value[0] if isinstance(value, list) else value

        # BERT-family folders name no eos/bos: [SEP] ends a sequence, [CLS] starts it.
        eos = token_id("eos_token")
        if eos is None:
            eos = token_id("sep_token")
        if eos is None:
            raise UserError(f"{owner}: {folder} names no eos_token (tokenizer_config.json) nor "
                            f"eos_token_id (generation_config.json); generation cannot stop.")
        bos = token_id("bos_token")
        if bos is None:
            bos = token_id("cls_token")
        pad = token_id("pad_token")
        if prompt is not None:
            prompt_ids = []
            for text in prompt:
                found = tok.token_to_id(str(text))
                if found is None:
                    raise UserError(f"{owner}: prompt token {text!r} is not in {file}; "
                                    f"fix tokenizer.prompt.")
                prompt_ids.append(found)
        else:
            start = numbers.get("decoder_start_token_id")
            prompt_ids = [start if start is not None else (bos if bos is not None else eos)]
        return cls(tokenizer=tok, pad_id=eos if pad is None else pad,
                   bos_id=eos if bos is None else bos, eos_id=eos, unk_id=token_id("unk_token"),
                   prompt_ids=prompt_ids, source=str(source),
                   multilingual=bool(numbers.get("is_multilingual", True)),
                   generation_config=_merged(folder, _ID_FILES[:1], owner) or None)

    @property
    def prompt_ids(self) -> list[int]:
        return list(self._prompt)

    # ------------------------------------------------------------------ Whisper's speech tokens
    @cached_property
    def languages(self) -> dict[str, int]:
        """Language code -> token id, in vocabulary order (Whisper's order: most data first).
        English-only models keep the tokens but read none (:class:`~mmtf.text.prompt.WhisperPrompt`)."""
        found = {}
        for i, token in sorted(self._tok.get_added_tokens_decoder().items()):
            match = _LANGUAGE.fullmatch(token.content)
            if match:
                found[match.group(1)] = i
        return found

    @cached_property
    def task_ids(self) -> dict[str, int]:
        """``transcribe`` / ``translate`` -> token id (those in the vocabulary)."""
        ids = {task: self._tok.token_to_id(f"<|{task}|>") for task in JOBS}
        return {task: i for task, i in ids.items() if i is not None}

    @property
    def start_of_transcript_id(self) -> int | None:
        return self._tok.token_to_id(START_OF_TRANSCRIPT)

    @property
    def no_timestamps_id(self) -> int | None:
        return self._tok.token_to_id(NO_TIMESTAMPS)

    @property
    def timestamp_begin(self) -> int | None:
        """Id of ``<|0.00|>``; every id from it on is a timestamp (0.02 s apart). Folders whose
        ``tokenizer.json`` lacks the timestamp strings (older hub revisions, CTranslate2
        conversions) still have the model's rows: ``<|notimestamps|>`` + 1, as openai/whisper
        and transformers take it. None without either token."""
        found = self._tok.token_to_id(FIRST_TIMESTAMP)
        no_timestamps = self.no_timestamps_id
        return found if found is not None or no_timestamps is None else no_timestamps + 1

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special

    def __repr__(self) -> str:
        return (f"PretrainedTokenizer(vocab_size={self.vocab_size}, pad={self.pad_id}, "
                f"bos={self.bos_id}, eos={self.eos_id}, prompt={self.prompt_ids}, "
                f"source={self.source!r})")


def _merged(folder: Path, names: Sequence[str], owner: str) -> dict[str, Any]:
    """The keys of the JSON files ``names`` in ``folder`` (missing files skipped), earlier
    files first."""
    out: dict[str, Any] = {}
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise UserError(f"{owner}: {path} is not valid JSON ({err}).") from None
        for key, value in data.items():
            if out.get(key) is None:
                out[key] = value
    return out


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": ..}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
