"""Byte-pair-encoding tokenizer trained with HuggingFace `tokenizers` (Sennrich et al., 2016).

The pipeline is the library's: a normaliser (NFKC, optional lower-casing and punctuation
removal, whitespace collapsed), a Metaspace pre-tokenizer (a space becomes "▁" and starts a
word, so decoding restores spaces exactly) followed by a Punctuation pre-tokenizer (each
punctuation mark is its own piece, so merges never glue "dog" and "." together), a BPE model
trained by ``BpeTrainer``, and the Metaspace decoder.

Specials ``<pad> <bos> <eos> <unk>`` are ids 0..3. A character never seen in training encodes to
``<unk>`` (id 3), one per character; decode drops it. The vocabulary holds at most
``vocab_size`` entries: the trainer keeps at most ``vocab_size - 4`` distinct characters (rarest
dropped, they become ``<unk>``) and stops merging when it reaches ``vocab_size`` or when no pair
occurs ``min_frequency`` times. On a small corpus the learned vocabulary is therefore smaller
than requested, and :attr:`BPETokenizer.vocab_size` reports what was learned.

Shapes: ids are python ``list[int]``.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from mmtf.errors import UserError
from mmtf.text.base import BOS, EOS, SPECIAL_TOKENS, UNK, BackedTokenizer, build_normalizer


class BPETokenizer(BackedTokenizer):
    """BPE tokenizer backed by a `tokenizers.Tokenizer`; build it with :meth:`train`.

    Args:
        tokenizer: a trained `tokenizers.Tokenizer` whose ids 0..3 are the mmtf specials.
        lowercase: whether its normaliser lower-cases (recorded for the JSON and repr).
        strip_punctuation: whether its normaliser removes punctuation (recorded likewise).
    """

    kind = "bpe"
    _payload_keys = ("lowercase", "strip_punctuation")

    def __init__(self, *, tokenizer: HFTokenizer, lowercase: bool, strip_punctuation: bool) -> None:
        found = [tokenizer.id_to_token(i) for i in range(len(SPECIAL_TOKENS))]
        if tuple(found) != SPECIAL_TOKENS:
            raise UserError(
                f"BPETokenizer: tokenizer ids 0..3 must be {list(SPECIAL_TOKENS)}, got {found}; "
                f"build it with BPETokenizer.train."
            )
        super().__init__(tokenizer)
        self.lowercase = bool(lowercase)
        self.strip_punctuation = bool(strip_punctuation)

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        *,
        vocab_size: int,
        lowercase: bool = True,
        strip_punctuation: bool = False,
        min_frequency: int = 2,
    ) -> BPETokenizer:
        """Learn a BPE vocabulary from a corpus.

        Args:
            texts: training sentences (any iterable, consumed once).
            vocab_size: the largest vocabulary, specials included; must be > 4. A corpus too
                small to reach it gives a smaller vocabulary (see the module docstring).
            lowercase: lower-case text before splitting (at training and at encoding).
            strip_punctuation: remove punctuation; otherwise each mark is its own token.
            min_frequency: a pair is merged only if it occurs at least this often.

        Returns:
            The trained tokenizer.

        Raises:
            ValueError: vocab_size or min_frequency out of range, or texts has no characters.
        """
        n_special = len(SPECIAL_TOKENS)
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= n_special:
            raise UserError(
                f"BPETokenizer.train: vocab_size ({vocab_size!r}) must be an int > {n_special}, "
                f"the number of special tokens {list(SPECIAL_TOKENS)}; raise vocab_size."
            )
        if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
            raise UserError(
                f"BPETokenizer.train: min_frequency ({min_frequency!r}) must be an int >= 1."
            )
        tok = HFTokenizer(models.BPE(unk_token=UNK))
        tok.normalizer = build_normalizer(lowercase=lowercase, strip_punctuation=strip_punctuation)
        # Metaspace marks word starts with "▁"; Punctuation then isolates marks ("dog." ->
        # "▁dog", "."), which the Metaspace decoder glues back without a space.
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation("isolated")]
        )
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),  # listed first, so they get ids 0..3
            limit_alphabet=vocab_size - n_special,  # never exceed vocab_size with characters
            show_progress=False,
        )
        tok.train_from_iterator(_checked_texts(texts), trainer=trainer)
        if tok.get_vocab_size(with_added_tokens=True) <= n_special:
            raise UserError(
                "BPETokenizer.train: texts has no characters to learn from (empty corpus or "
                "only whitespace/stripped punctuation); pass the training captions."
            )
        # Lets the saved tokenizer.json add <bos>/<eos> by itself when used outside mmtf.
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A {EOS}", special_tokens=[(BOS, 1), (EOS, 2)]
        )
        return cls(tokenizer=tok, lowercase=lowercase, strip_punctuation=strip_punctuation)

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
                f"strip_punctuation={self.strip_punctuation})")


def _checked_texts(texts: Iterable[str]) -> Iterable[str]:
    """Yield the corpus, failing with the index of the first non-string item."""
    if isinstance(texts, str):
        raise TypeError("BPETokenizer.train: texts must be an iterable of strings, not one str.")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(
                f"BPETokenizer.train: texts[{i}] must be a str, got {type(text).__name__}."
            )
        yield text
