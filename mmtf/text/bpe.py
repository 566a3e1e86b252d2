"""Byte-pair-encoding tokenizer trained with HuggingFace `tokenizers` (Sennrich et al., 2016).

Pipeline: mmtf's normaliser, Metaspace then Punctuation pre-tokenizers (each mark its own
piece), a BPE model from ``BpeTrainer``, the Metaspace decoder. Specials ``<pad> <bos> <eos>
<unk>`` are ids 0..3; extra special tokens (a mixture's ``<|clotho|>``) follow at 4.. and can
form the prompt. Unseen characters encode to ``<unk>``. A small corpus learns fewer than
``vocab_size`` entries; :attr:`BPETokenizer.vocab_size` reports what was learned.

Shapes: ids are python ``list[int]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from mmtf.errors import UserError
from mmtf.text.base import (
    BOS,
    EOS,
    SPECIAL_TOKENS,
    UNK,
    BackedTokenizer,
    build_normalizer,
    checked_texts,
)

BOS_ID = SPECIAL_TOKENS.index(BOS)


class BPETokenizer(BackedTokenizer):
    """BPE tokenizer backed by a `tokenizers.Tokenizer`; build it with :meth:`train`.

    Args:
        tokenizer: a trained `tokenizers.Tokenizer` whose ids 0..3 are the mmtf specials.
        lowercase: whether its normaliser lower-cases (recorded for the JSON and repr).
        strip_punctuation: whether its normaliser removes punctuation (recorded likewise).
        prompt: the decoder prompt as token strings (special tokens of the vocabulary); None =
            ``[<bos>]``.
    """

    kind = "bpe"
    _payload_keys = ("lowercase", "strip_punctuation", "prompt")
    _payload_defaults = {"prompt": None}   # tokenizers written before prompts could be set

    def __init__(self, *, tokenizer: HFTokenizer, lowercase: bool, strip_punctuation: bool,
                 prompt: Sequence[str] | None = None) -> None:
        found = [tokenizer.id_to_token(i) for i in range(len(SPECIAL_TOKENS))]
        if tuple(found) != SPECIAL_TOKENS:
            raise UserError(
                f"BPETokenizer: tokenizer ids 0..3 must be {list(SPECIAL_TOKENS)}, got {found}; "
                f"build it with BPETokenizer.train.")
        super().__init__(tokenizer)
        self.lowercase = bool(lowercase)
        self.strip_punctuation = bool(strip_punctuation)
        # Special ids: the four, plus the extra special tokens training added (ids 4..).
        self._special = frozenset(range(len(SPECIAL_TOKENS))) | frozenset(
            i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)
        self.prompt = None if prompt is None else [str(t) for t in prompt]
        self._prompt = [BOS_ID]
        if self.prompt is not None:
            ids = [tokenizer.token_to_id(t) for t in self.prompt]
            bad = [t for t, i in zip(self.prompt, ids) if i is None or i not in self._special]
            if not self.prompt or bad:
                raise UserError(f"BPETokenizer: prompt {self.prompt} must be a non-empty list of "
                                f"the vocabulary's special tokens "
                                f"({[self.id_to_token(i) for i in sorted(self._special)]}); "
                                f"{bad} are not; add them with tokenizer.special_tokens.")
            self._prompt = ids

    @property
    def prompt_ids(self) -> list[int]:
        return list(self._prompt)

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special

    def _to_dict(self) -> dict[str, Any]:
        payload = super()._to_dict()
        if payload["prompt"] is None:   # the JSON of a [<bos>] tokenizer stays what it was
            del payload["prompt"]
        return payload

    @classmethod
    def train(cls, texts: Iterable[str], *, vocab_size: int, lowercase: bool = True,
              strip_punctuation: bool = False, min_frequency: int = 2,
              special_tokens: Sequence[str] = (), prompt: Sequence[str] | None = None,
              ) -> BPETokenizer:
        """Learn a BPE vocabulary from a corpus.

        Args:
            texts: training sentences (any iterable, consumed once).
            vocab_size: the largest vocabulary, specials included; must be > 4.
            lowercase: lower-case text before splitting.
            strip_punctuation: remove punctuation; otherwise each mark is its own token.
            min_frequency: a pair is merged only if it occurs at least this often.
            special_tokens: extra special tokens (ids 4.. in this order).
            prompt: the decoder prompt as token strings; None = ``[<bos>]``.

        Raises:
            ValueError: vocab_size or min_frequency out of range, or texts has no characters.
        """
        n_special = len(SPECIAL_TOKENS)
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= n_special:
            raise UserError(
                f"BPETokenizer.train: vocab_size ({vocab_size!r}) must be an int > {n_special}, "
                f"the number of special tokens {list(SPECIAL_TOKENS)}; raise vocab_size.")
        if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
            raise UserError(
                f"BPETokenizer.train: min_frequency ({min_frequency!r}) must be an int >= 1.")
        extra = [str(t) for t in special_tokens]
        clash = sorted({t for t in extra if extra.count(t) > 1 or t in SPECIAL_TOKENS or not t})
        if clash:
            raise UserError(f"BPETokenizer.train: special_tokens {extra} must be distinct, "
                            f"non-empty and none of {list(SPECIAL_TOKENS)}; {clash} are not.")
        if vocab_size <= n_special + len(extra):
            raise UserError(f"BPETokenizer.train: vocab_size ({vocab_size}) must exceed the "
                            f"{n_special + len(extra)} special tokens; raise vocab_size.")
        tok = HFTokenizer(models.BPE(unk_token=UNK))
        tok.normalizer = build_normalizer(lowercase=lowercase, strip_punctuation=strip_punctuation)
        # Metaspace marks word starts with "▁"; Punctuation then isolates marks ("dog." ->
        # "▁dog", "."), which the Metaspace decoder glues back without a space.
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation("isolated")])
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
            special_tokens=[*SPECIAL_TOKENS, *extra],  # listed first: ids 0..3, then 4..
            limit_alphabet=vocab_size - n_special - len(extra))  # never exceed vocab_size
        tok.train_from_iterator(checked_texts(texts, "BPETokenizer.train"), trainer=trainer)
        if tok.get_vocab_size(with_added_tokens=True) <= n_special:
            raise UserError(
                "BPETokenizer.train: texts has no characters to learn from (empty corpus or "
                "only whitespace/stripped punctuation); pass the training captions.")
        # Lets the saved tokenizer.json add <bos>/<eos> by itself when used outside mmtf.
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A {EOS}", special_tokens=[(BOS, 1), (EOS, 2)])
        return cls(tokenizer=tok, lowercase=lowercase, strip_punctuation=strip_punctuation,
                   prompt=prompt)

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
                f"strip_punctuation={self.strip_punctuation})")
