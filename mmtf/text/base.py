"""The tokenizer interface shared by every mmtf text model, and its JSON (de)serialisation.

A tokenizer maps text to ids and back and names its special ids (``pad_id``, ``bos_id``,
``eos_id``, ``unk_id``) and decoder prompt (``prompt_ids``). mmtf's own tokenizers fix
``<pad>=0 <bos>=1 <eos>=2 <unk>=3``, prompt with ``[bos]`` and normalise text first (NFKC,
optional lower-casing and punctuation removal, whitespace collapsed), so ``decode(encode(x)) ==
normalize(x)`` for seen characters; an imported ``tokenizer.json`` keeps the original's ids. A
tokenizer serialises to one JSON document whose ``kind`` picks the class on load, so a
checkpoint carries it as a string. Why: docs/design/prompt-and-special-tokens.md.

Shapes: every id sequence is a python ``list[int]``.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import Regex, normalizers
from tokenizers import Tokenizer as HFTokenizer

from mmtf.errors import UserError, require_file

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)  # index == id in mmtf's own tokenizers
FORMAT_VERSION = 1

# Unicode category P plus the ASCII symbols the `tokenizers` Punctuation pre-tokenizer also
# isolates, so stripping and isolating punctuation agree.
PUNCTUATION_PATTERN = r"[\p{P}$+<=>^`|~]"
_WHITESPACE = re.compile(r"\s+")


def build_normalizer(*, lowercase: bool, strip_punctuation: bool) -> normalizers.Normalizer:
    """mmtf's tokenizer normaliser: NFKC, optional lower-casing and punctuation removal, then
    whitespace runs collapsed and the ends stripped."""
    steps: list[normalizers.Normalizer] = [normalizers.NFKC()]
    if lowercase:
        steps.append(normalizers.Lowercase())
    if strip_punctuation:
        steps.append(normalizers.Replace(Regex(PUNCTUATION_PATTERN), ""))
    steps += [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    return normalizers.Sequence(steps)


def checked_texts(texts: Iterable[str], owner: str) -> Iterator[str]:
    """Yield a training corpus, failing with the index of the first non-string item."""
    if isinstance(texts, str):
        raise TypeError(f"{owner}: texts must be an iterable of strings, not one str.")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{owner}: texts[{i}] must be a str, got {type(text).__name__}.")
        yield text


class Tokenizer(ABC):
    """Base class: specials, truncation, batching, decoding rules and JSON (de)serialisation.

    Subclasses implement the id mapping (:meth:`_encode_many`, :meth:`_decode_one`), the size
    (:attr:`vocab_size`) and the JSON payload (:meth:`_to_dict`, :meth:`_from_dict`).
    """

    kind: ClassVar[str] = ""
    _registry: ClassVar[dict[str, type[Tokenizer]]] = {}

    # mmtf's own ids; a tokenizer imported from elsewhere sets its own per instance.
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int | None = 3
    special_tokens: ClassVar[tuple[str, ...]] = SPECIAL_TOKENS

    @property
    def prompt_ids(self) -> list[int]:
        """The ids every target starts with and generation is fed first (``[bos]`` here)."""
        return [self.bos_id]

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids that ``decode(skip_special=True)`` drops (the specials, ids 0..3 here)."""
        return frozenset(range(len(self.special_tokens)))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            Tokenizer._registry[cls.kind] = cls

    # ------------------------------------------------------------------ subclass hooks
    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, specials included; valid ids are ``0 .. vocab_size - 1``."""

    @abstractmethod
    def normalize(self, text: str) -> str:
        """The text as the tokenizer sees it before splitting (see the module docstring)."""

    @abstractmethod
    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text, without specials and without truncation."""

    @abstractmethod
    def _decode_one(self, ids: list[int], skip_special: bool) -> str:
        """Text of ids that are already validated (and stripped of specials if skip_special)."""

    @abstractmethod
    def _to_dict(self) -> dict[str, Any]:
        """JSON-able payload, without ``kind`` and ``version``."""

    @classmethod
    @abstractmethod
    def _from_dict(cls, payload: dict[str, Any]) -> Tokenizer:
        """Inverse of :meth:`_to_dict`."""

    @abstractmethod
    def id_to_token(self, idx: int) -> str:
        """The vocabulary entry of one id."""

    @abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of one vocabulary entry, or None when it is not in the vocabulary."""

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str, add_special: bool = True, max_len: int | None = None) -> list[int]:
        """Ids of one text.

        Args:
            add_special: wrap the ids as ``[*prompt_ids, ..., eos]``.
            max_len: keep at most this many ids; with specials the body is cut and ``eos`` kept.

        Raises:
            TypeError: text is not a str.
            ValueError: max_len is too small.
        """
        return self.encode_batch([text], add_special=add_special, max_len=max_len)[0]

    def encode_batch(self, texts: Iterable[str], add_special: bool = True,
                     max_len: int | None = None) -> list[list[int]]:
        """Ids of many texts, one list each (same rules as :meth:`encode`; not padded)."""
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(
                    f"{type(self).__name__}.encode: texts[{i}] must be a str, got "
                    f"{type(text).__name__} ({text!r}).")
        prompt = self.prompt_ids
        min_len = len(prompt) + 1 if add_special else 0
        if max_len is not None and (isinstance(max_len, bool) or max_len < min_len):
            raise UserError(
                f"{type(self).__name__}.encode: max_len ({max_len}) must be >= {min_len}"
                + (" to hold the prompt and <eos>; raise max_len or pass add_special=False."
                   if add_special else "; pass max_len=None for no limit."))
        out = []
        for ids in self._encode_many(texts):
            if add_special:
                if max_len is not None:
                    ids = ids[: max_len - min_len]
                ids = [*prompt, *ids, self.eos_id]
            elif max_len is not None:
                ids = ids[:max_len]
            out.append(ids)
        return out

    # ------------------------------------------------------------------ decoding
    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of one id sequence.

        Args:
            ids: ints, or a 1-D tensor / array.
            skip_special: drop a leading prompt, stop at the first ``eos`` and drop the other
                specials; otherwise every id is rendered, specials as their token text.

        Raises:
            ValueError: an id is outside ``0 .. vocab_size - 1``.
        """
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(
                f"{type(self).__name__}.decode: ids must lie in [0, {self.vocab_size - 1}] "
                f"(vocab_size={self.vocab_size}); got {bad[:5]}. Strip ignore-index values "
                f"such as -100 before decoding.")
        if not skip_special:
            return self._decode_one(ids, skip_special=False)
        prompt = self.prompt_ids
        if ids[: len(prompt)] == prompt:          # a target; generated ids carry no prompt
            ids = ids[len(prompt):]
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        special = self.special_ids
        text = self._decode_one([i for i in ids if i not in special], skip_special=True)
        return _WHITESPACE.sub(" ", text).strip()

    def decode_batch(self, batch: Iterable[Sequence[int]], skip_special: bool = True) -> list[str]:
        """:meth:`decode` of each sequence (a list of lists, or a 2-D tensor of padded rows)."""
        if hasattr(batch, "tolist"):
            batch = batch.tolist()
        return [self.decode(ids, skip_special=skip_special) for ids in batch]

    # ------------------------------------------------------------------ serialisation
    def to_json_str(self) -> str:
        """The whole tokenizer as one JSON string (``kind``, ``version`` and the payload)."""
        return json.dumps({"kind": self.kind, "version": FORMAT_VERSION, **self._to_dict()},
                          ensure_ascii=False)

    @classmethod
    def from_json_str(cls, s: str) -> Tokenizer:
        """Rebuild a tokenizer from :meth:`to_json_str`; the ``kind`` field picks the class.

        Raises:
            ValueError: not JSON, an unknown ``kind`` or newer ``version``, a payload its class
                rejects, or ``cls`` a subclass that does not match ``kind``.
        """
        try:
            data = json.loads(s)
        except json.JSONDecodeError as err:
            raise UserError(f"Tokenizer.from_json_str: not valid JSON ({err}).") from err
        if not isinstance(data, dict) or "kind" not in data:
            raise UserError(
                "Tokenizer.from_json_str: expected a JSON object with a 'kind' field "
                f"(one of {sorted(cls._registry)}); was this file written by Tokenizer.save?")
        kind = data.pop("kind")
        if kind not in cls._registry:
            raise UserError(
                f"Tokenizer.from_json_str: unknown kind ({kind!r}); "
                f"expected one of {sorted(cls._registry)}.")
        version = data.pop("version", FORMAT_VERSION)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise UserError(
                f"Tokenizer.from_json_str: version ({version!r}) is not supported by this mmtf "
                f"(format version {FORMAT_VERSION}); upgrade mmtf.")
        target = cls._registry[kind]
        if cls is not Tokenizer and not issubclass(target, cls):
            raise UserError(
                f"{cls.__name__}.from_json_str: the JSON holds kind={kind!r}, not "
                f"{cls.kind!r}; use Tokenizer.from_json_str or load_tokenizer to dispatch.")
        return target._from_dict(data)

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_json_str` to ``path`` (UTF-8); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json_str(), encoding="utf-8")
        return path

    def __len__(self) -> int:
        return self.vocab_size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.to_json_str() == other.to_json_str()

    __hash__ = None  # type: ignore[assignment]  # mutable-ish payload; equality is by content

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class BackedTokenizer(Tokenizer):
    """A tokenizer whose pipeline is a `tokenizers.Tokenizer`; a subclass adds its special ids
    and the constructor values named in ``_payload_keys`` (stored beside the backend's JSON).

    Args:
        tokenizer: the backend; text that spells a special token encodes as ordinary text.
    """

    # Constructor arguments besides ``tokenizer``, stored in the JSON payload by name.
    _payload_keys: ClassVar[tuple[str, ...]] = ()
    # Values of payload keys added after checkpoints were written without them.
    _payload_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, tokenizer: HFTokenizer) -> None:
        tokenizer.encode_special_tokens = True
        self._tok = tokenizer
        # The fast batch path (no offsets) exists from tokenizers 0.21 on.
        self._encode_batch_fn = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self) -> HFTokenizer:
        """The underlying `tokenizers.Tokenizer` (read it, do not mutate it)."""
        return self._tok

    def normalize(self, text: str) -> str:
        normalizer = self._tok.normalizer
        return text if normalizer is None else normalizer.normalize_str(text)

    def id_to_token(self, idx: int) -> str:
        return self._tok.id_to_token(idx)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        if len(texts) == 1:
            return [self._tok.encode(texts[0], add_special_tokens=False).ids]
        return [e.ids for e in self._encode_batch_fn(texts, add_special_tokens=False)]

    def _decode_one(self, ids: list[int], skip_special: bool) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    def _to_dict(self) -> dict[str, Any]:
        return {**{key: getattr(self, key) for key in self._payload_keys},
                "tokenizer": json.loads(self._tok.to_str())}

    @classmethod
    def _from_dict(cls, payload: dict[str, Any]) -> BackedTokenizer:
        try:
            backend = HFTokenizer.from_str(json.dumps(payload["tokenizer"]))
            return cls(tokenizer=backend, **{
                key: payload[key] if key in payload or key not in cls._payload_defaults
                else cls._payload_defaults[key] for key in cls._payload_keys})
        except KeyError as err:
            raise UserError(f"{cls.__name__}: JSON is missing the field {err}.") from err
        except Exception as err:  # the Rust side raises its own exception type
            if isinstance(err, ValueError):
                raise
            raise UserError(f"{cls.__name__}: the 'tokenizer' field is not a valid "
                            f"tokenizers JSON ({err}).") from err


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer written by :meth:`Tokenizer.save`; the JSON ``kind`` picks the class.

    Raises:
        UserError: path is not a file, or not an mmtf tokenizer.
    """
    path = require_file(path, what="load_tokenizer: tokenizer file",
                        fix="pass the tokenizer.json written by Tokenizer.save (a run folder "
                            "holds one)")
    try:
        return Tokenizer.from_json_str(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise UserError(f"load_tokenizer: {path}: {err}") from err
