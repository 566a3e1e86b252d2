"""CIDEr-D (Vedantam et al., 2015) as pycocoevalcap's ``Cider`` scorer computes it.

n = 1..4; TF-IDF vectors with ``df`` = items whose references hold the n-gram (from the
evaluated corpus), ``idf = log(N) - log(max(1, df))``; per n, ``sum_g min(v_c[g], v_r[g]) v_r[g]
/ (|v_c| |v_r|)`` times ``exp(-(l_c - l_r)^2 / (2 * 6^2))``; the item score is the mean over n
and references times 10, the corpus score the mean over items. As in the reference code, the
length is the bigram count (words - 1, floored at 0), and a one-item corpus scores 0 (idf = 0).

Inputs are tokenised captions: each caption a ``list[str]``."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from mmtf.metrics.bleu import ngram_counts

N, SIGMA = 4, 6.0


def _vector(counts: Counter[tuple[str, ...]], df: Counter[tuple[str, ...]], log_n: float):
    """TF-IDF weights per n-gram order, their norms, and the bigram count (the 'length')."""
    vec: list[dict[tuple[str, ...], float]] = [{} for _ in range(N)]
    norm = [0.0] * N
    for gram, tf in counts.items():
        k = len(gram) - 1
        w = tf * (log_n - math.log(max(1.0, df[gram])))
        vec[k][gram] = w
        norm[k] += w * w
    length = sum(tf for gram, tf in counts.items() if len(gram) == 2)
    return vec, [math.sqrt(x) for x in norm], length


def cider_d_scores(candidates: Sequence[Sequence[str]],
                   references: Sequence[Sequence[Sequence[str]]]) -> list[float]:
    """CIDEr-D of each item of a corpus (document frequencies from this corpus)."""
    ref_counts = [[ngram_counts(r, N) for r in refs] for refs in references]
    df: Counter[tuple[str, ...]] = Counter()
    for refs in ref_counts:
        df.update({gram for counts in refs for gram in counts})
    log_n = math.log(float(len(references)))

    scores = []
    for cand, refs in zip(candidates, ref_counts):
        vec_c, norm_c, len_c = _vector(ngram_counts(cand, N), df, log_n)
        total = [0.0] * N
        for counts in refs:
            vec_r, norm_r, len_r = _vector(counts, df, log_n)
            penalty = math.e ** (-((len_c - len_r) ** 2) / (2 * SIGMA**2))
            for k in range(N):
                val = sum(min(w, vec_r[k].get(g, 0.0)) * vec_r[k].get(g, 0.0)
                          for g, w in vec_c[k].items())
                if norm_c[k] != 0 and norm_r[k] != 0:
                    val /= norm_c[k] * norm_r[k]
                total[k] += val * penalty
        scores.append(sum(total) / N / len(refs) * 10.0)
    return scores


def corpus_cider_d(candidates: Sequence[Sequence[str]],
                   references: Sequence[Sequence[Sequence[str]]]) -> float:
    """Mean CIDEr-D over a corpus."""
    scores = cider_d_scores(candidates, references)
    return sum(scores) / len(scores)
