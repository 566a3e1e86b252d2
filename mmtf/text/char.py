"""Character-level tokenizer: one id per character, for tiny tests and small vocabularies.

The vocabulary is the four specials then every distinct character of the normalised training
text, sorted (deterministic); unknown characters encode to ``<unk>``. Normalised as the BPE
tokenizer, punctuation kept.

Shapes: ids are python ``list[int]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mmtf.errors import UserError
from mmtf.text.base import SPECIAL_TOKENS, Tokenizer, build_normalizer, checked_texts


class CharTokenizer(Tokenizer):
    """Maps each character to an id; build it with :meth:`train`.

    Args:
        vocab: the id -> token table; entries 0..3 must be the specials, the rest single
            distinct characters.
        lowercase: lower-case text before encoding.
    """

    kind = "char"

    def __init__(self, *, vocab: list[str], lowercase: bool = True) -> None:
        if tuple(vocab[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise UserError(
                f"CharTokenizer: vocab must start with {list(SPECIAL_TOKENS)}, got "
                f"{vocab[: len(SPECIAL_TOKENS)]}; build it with CharTokenizer.train.")
        chars = vocab[len(SPECIAL_TOKENS):]
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad or len(set(chars)) != len(chars):
            raise UserError(
                f"CharTokenizer: vocab entries after the specials must be distinct single "
                f"characters; got {bad[:5] or 'duplicates'}.")
        self.vocab = list(vocab)
        self.lowercase = lowercase
        self._normalizer = build_normalizer(lowercase=lowercase, strip_punctuation=False)
        self._index = {c: i for i, c in enumerate(self.vocab)}
        # Only characters map through _index; "<unk>" typed as text is five characters.
        self._char_index = {c: i for c, i in self._index.items() if len(c) == 1}

    @classmethod
    def train(cls, texts: Iterable[str], *, lowercase: bool = True) -> CharTokenizer:
        """Collect the characters of a corpus.

        Raises:
            TypeError: texts is a str or holds a non-string.
            ValueError: the corpus has no characters.
        """
        normalizer = build_normalizer(lowercase=lowercase, strip_punctuation=False)
        chars: set[str] = set()
        for text in checked_texts(texts, "CharTokenizer.train"):
            chars.update(normalizer.normalize_str(text))
        if not chars:
            raise UserError(
                "CharTokenizer.train: texts has no characters to learn from (empty corpus or "
                "only whitespace); pass the training captions.")
        return cls(vocab=[*SPECIAL_TOKENS, *sorted(chars)], lowercase=lowercase)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def normalize(self, text: str) -> str:
        return self._normalizer.normalize_str(text)

    def id_to_token(self, idx: int) -> str:
        return self.vocab[idx]

    def token_to_id(self, token: str) -> int | None:
        return self._index.get(token)

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        get, unk = self._char_index.get, self.unk_id
        return [[get(c, unk) for c in self.normalize(t)] for t in texts]

    def _decode_one(self, ids: list[int], skip_special: bool) -> str:
        return "".join(self.vocab[i] for i in ids)

    def _to_dict(self) -> dict[str, Any]:
        return {"lowercase": self.lowercase, "vocab": self.vocab}

    @classmethod
    def _from_dict(cls, payload: dict[str, Any]) -> CharTokenizer:
        try:
            return cls(vocab=list(payload["vocab"]), lowercase=bool(payload["lowercase"]))
        except KeyError as err:
            raise UserError(f"CharTokenizer: JSON is missing the field {err}.") from err

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase})"
