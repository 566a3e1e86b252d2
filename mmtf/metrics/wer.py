"""Word and character error rates of speech recognition, after a text normalizer.

:func:`error_rates` normalises references and hypotheses (:mod:`mmtf.text.normalize`), aligns
them with jiwer and returns corpus WER / CER (``sum(S + D + I) / sum(reference words)``;
characters, spaces included, for CER) and one :class:`UtteranceErrors` row per utterance. An
empty normalised reference counts its hypothesis words as insertions."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jiwer

from mmtf.text.normalize import get_normalizer

ASR_METRICS: tuple[str, ...] = ("wer", "cer")
ERROR_COLUMNS: tuple[str, ...] = ("id", "wer", "substitutions", "deletions", "insertions", "hits",
                                  "reference", "hypothesis")


@dataclass(frozen=True)
class UtteranceErrors:
    """One utterance's word alignment: counts, and the normalised texts that were aligned."""

    id: Any
    substitutions: int
    deletions: int
    insertions: int
    hits: int
    reference: str
    hypothesis: str

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def wer(self) -> float:
        """This utterance's own WER: errors / reference words (an empty reference counts as one
        word, so the value stays finite: its insertions)."""
        return self.errors / max(self.substitutions + self.deletions + self.hits, 1)

    def to_row(self) -> dict[str, Any]:
        """The row of the errors table (:data:`ERROR_COLUMNS`)."""
        return {"wer": self.wer, **asdict(self)}


@dataclass(frozen=True)
class ErrorRates:
    """Corpus WER and CER and the per-utterance rows."""

    wer: float
    cer: float
    utterances: list[UtteranceErrors]

    def scores(self, names: Sequence[str] = ASR_METRICS) -> dict[str, float]:
        return {name: getattr(self, name) for name in names}


def error_rates(hypotheses: Sequence[str], references: Sequence[str], *,
                normalizer: str = "whisper_english",
                ids: Sequence[Any] | None = None) -> ErrorRates:
    """WER, CER and the per-utterance errors of ``hypotheses`` against ``references``.

    Args:
        normalizer: ``whisper_english`` | ``whisper_basic`` | ``none``, applied to both sides.
        ids: utterance ids for the rows (default: positions).

    Raises:
        ValueError: the lists differ in length or are empty, or every normalised reference is.
        ConfigError: an unknown normalizer.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"error_rates: {len(hypotheses)} hypotheses for {len(references)} "
                         f"references; pass one reference per hypothesis.")
    if not references:
        raise ValueError("error_rates: no utterances to score.")
    normalize = get_normalizer(normalizer)
    refs = [" ".join(normalize(r).split()) for r in references]
    hyps = [" ".join(normalize(h).split()) for h in hypotheses]
    if not any(refs):
        raise ValueError(f"error_rates: every reference is empty after the {normalizer!r} "
                         f"normalizer; there are no words to score against.")
    ids = list(range(len(refs))) if ids is None else list(ids)
    words = jiwer.process_words(refs, hyps)
    rows = []
    for key, ref, hyp, chunks in zip(ids, refs, hyps, words.alignments):
        counts = {"substitute": 0, "delete": 0, "insert": 0, "equal": 0}
        for chunk in chunks:
            span = chunk.ref_end_idx - chunk.ref_start_idx
            counts[chunk.type] += span if chunk.type != "insert" else (
                chunk.hyp_end_idx - chunk.hyp_start_idx)
        rows.append(UtteranceErrors(id=key, substitutions=counts["substitute"],
                                    deletions=counts["delete"], insertions=counts["insert"],
                                    hits=counts["equal"], reference=ref, hypothesis=hyp))
    chars = jiwer.process_characters(refs, hyps)
    return ErrorRates(wer=float(words.wer), cer=float(chars.cer), utterances=rows)


def write_errors_csv(path: str | Path, utterances: Sequence[UtteranceErrors]) -> Path:
    """Write the per-utterance errors table (:data:`ERROR_COLUMNS`), worst WER first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted((u.to_row() for u in utterances), key=lambda r: -r["wer"])
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=ERROR_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path
