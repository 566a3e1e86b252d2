"""ROUGE-L as pycocoevalcap's ``Rouge`` computes it (Lin, 2004).

Per candidate, the max LCS precision and the max LCS recall over the references give ``F = (1 +
b^2) P R / (R + b^2 P)`` with ``b = 1.2``; the corpus score is the mean F. An empty caption counts
as one empty token. Inputs: each caption a ``list[str]``."""

from __future__ import annotations

from collections.abc import Sequence

BETA = 1.2


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token lists (O(len(a) len(b)))."""
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l_sentence(candidate: Sequence[str], references: Sequence[Sequence[str]],
                     beta: float = BETA) -> float:
    """ROUGE-L F of one candidate against its references."""
    cand = list(candidate) or [""]  # pycocoevalcap: "".split(" ") == [""]
    precision = recall = 0.0
    for ref in references:
        ref = list(ref) or [""]
        lcs = lcs_length(ref, cand)
        precision = max(precision, lcs / len(cand))
        recall = max(recall, lcs / len(ref))
    if precision == 0 or recall == 0:
        return 0.0
    return (1 + beta**2) * precision * recall / (recall + beta**2 * precision)


def corpus_rouge_l(candidates: Sequence[Sequence[str]],
                   references: Sequence[Sequence[Sequence[str]]]) -> float:
    """Mean ROUGE-L F over a corpus."""
    scores = [rouge_l_sentence(c, r) for c, r in zip(candidates, references)]
    return sum(scores) / len(scores)
