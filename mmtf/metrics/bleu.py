"""Corpus BLEU-1..4 as pycocoevalcap's ``Bleu(4)`` with ``option="closest"`` (Papineni et al., 2002).

Clipped n-gram matches against the max count over references; the effective reference length is
the closest one (ties: shorter); counts are summed over the corpus, then ``BLEU-k = (prod_{j<=k}
(correct_j + 1e-15) / (guess_j + 1e-9)) ** (1/k)`` times the brevity penalty ``exp(1 - r/c)``
when ``c < r`` (the epsilons are pycocoevalcap's). Inputs: each caption a ``list[str]``."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

_TINY, _SMALL = 1e-15, 1e-9


def ngram_counts(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    """Counts of every 1..n-gram of a token list."""
    return Counter(tuple(tokens[i:i + k]) for k in range(1, n + 1)
                   for i in range(len(tokens) - k + 1))


def corpus_bleu(
    candidates: Sequence[Sequence[str]],
    references: Sequence[Sequence[Sequence[str]]],
    max_n: int = 4,
) -> list[float]:
    """``[BLEU-1, ..., BLEU-max_n]`` of a corpus: one tokenised candidate per item, and each
    item's tokenised references (at least one each)."""
    correct, guess = [0] * max_n, [0] * max_n
    test_len = ref_len = 0
    for cand, refs in zip(candidates, references):
        max_ref: dict[tuple[str, ...], int] = {}
        for ref in refs:
            for gram, count in ngram_counts(ref, max_n).items():
                max_ref[gram] = max(max_ref.get(gram, 0), count)
        c = len(cand)
        test_len += c
        ref_len += min((abs(len(r) - c), len(r)) for r in refs)[1]  # closest, ties -> shorter
        for k in range(max_n):
            guess[k] += max(0, c - k)
        for gram, count in ngram_counts(cand, max_n).items():
            correct[len(gram) - 1] += min(max_ref.get(gram, 0), count)

    scores, prod = [], 1.0
    for k in range(max_n):
        prod *= (correct[k] + _TINY) / (guess[k] + _SMALL)
        scores.append(prod ** (1.0 / (k + 1)))
    ratio = (test_len + _TINY) / (ref_len + _SMALL)
    if ratio < 1:
        penalty = math.exp(1 - 1 / ratio)
        scores = [s * penalty for s in scores]
    return scores
