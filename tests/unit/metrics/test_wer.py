"""WER / CER: equal to jiwer and to a hand-written Levenshtein alignment; per-utterance rows;
CaptionMetrics scoring transcripts."""

from __future__ import annotations

import csv
import random

import jiwer
import pytest

from mmtf.errors import ConfigError
from mmtf.metrics import CaptionMetrics
from mmtf.metrics.wer import error_rates, write_errors_csv
from mmtf.text.normalize import get_normalizer

REFS = ["the cat sat on the mat", "Hello, World!", "I won't pay twenty dollars",
        "colour of the centre", "a b c d e f", "uh", "one two three"]
HYPS = ["the cat sat on mat", "hello word", "i will not pay $20", "color of the center",
        "a x c d e f g h", "noise words", ""]


def levenshtein(ref: list[str], hyp: list[str]) -> tuple[int, int, int, int]:
    """(substitutions, deletions, insertions, hits) of a minimum-edit alignment, written out:
    the dynamic programme over prefixes, then a walk back preferring hits/substitutions."""
    n, m = len(ref), len(hyp)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        cost[i][0] = i
    for j in range(m + 1):
        cost[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            same = ref[i - 1] == hyp[j - 1]
            cost[i][j] = min(cost[i - 1][j - 1] + (0 if same else 1), cost[i - 1][j] + 1,
                             cost[i][j - 1] + 1)
    s = d = ins = h = 0
    i, j = n, m
    while i or j:
        if i and j and cost[i][j] == cost[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            h += ref[i - 1] == hyp[j - 1]
            s += ref[i - 1] != hyp[j - 1]
            i, j = i - 1, j - 1
        elif i and cost[i][j] == cost[i - 1][j] + 1:
            d, i = d + 1, i - 1
        else:
            ins, j = ins + 1, j - 1
    return s, d, ins, h


@pytest.mark.parametrize("normalizer", ["whisper_english", "whisper_basic", "none"])
def test_wer_equals_jiwer_and_hand_alignment(normalizer):
    norm = get_normalizer(normalizer)
    refs = [" ".join(norm(r).split()) for r in REFS]
    hyps = [" ".join(norm(h).split()) for h in HYPS]
    rates = error_rates(HYPS, REFS, normalizer=normalizer)
    assert rates.wer == pytest.approx(jiwer.wer(refs, hyps))
    assert rates.cer == pytest.approx(jiwer.cer(refs, hyps))
    totals = [0, 0, 0, 0]
    for row, ref, hyp in zip(rates.utterances, refs, hyps):
        expected = levenshtein(ref.split(), hyp.split())
        got = (row.substitutions, row.deletions, row.insertions, row.hits)
        # Alignments of equal cost may trade an S for a D + I; the error total cannot differ.
        assert sum(got[:3]) == sum(expected[:3]), (ref, hyp)
        assert got[0] + got[1] + got[3] == len(ref.split())
        totals = [a + b for a, b in zip(totals, got)]
        assert (row.reference, row.hypothesis) == (ref, hyp)
    words = sum(len(r.split()) for r in refs)
    assert rates.wer == pytest.approx(sum(totals[:3]) / words)


def test_wer_random_strings_equal_hand_alignment():
    rng = random.Random(1)
    vocab = list("abcde")
    refs, hyps = [], []
    for _ in range(200):
        refs.append(" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 8))))
        hyps.append(" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 8))))
    rates = error_rates(hyps, refs, normalizer="none")
    errors = sum(sum(levenshtein(r.split(), h.split())[:3]) for r, h in zip(refs, hyps))
    assert rates.wer == pytest.approx(errors / sum(len(r.split()) for r in refs))
    assert rates.wer == pytest.approx(jiwer.wer(refs, hyps))


def test_normalizer_changes_the_score():
    assert error_rates(["I will not pay $20"], ["I won't pay twenty dollars"]).wer == 0.0
    assert error_rates(["I will not pay $20"], ["I won't pay twenty dollars"],
                       normalizer="none").wer > 0.5


def test_empty_reference_counts_insertions_and_all_empty_is_an_error():
    rates = error_rates(["hello there", "a b"], ["[noise]", "a b"], normalizer="whisper_english")
    assert rates.wer == pytest.approx(2 / 2)
    assert rates.utterances[0].insertions == 2 and rates.utterances[0].wer == 2.0
    with pytest.raises(ValueError, match="every reference is empty after the 'whisper_english'"):
        error_rates(["x"], ["uh"])
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        error_rates(["a", "b"], ["a"])


def test_errors_csv_worst_first(tmp_path):
    rates = error_rates(HYPS, REFS, ids=[f"u{i}" for i in range(len(REFS))])
    path = write_errors_csv(tmp_path / "errors.csv", rates.utterances)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["wer"]) for r in rows] == sorted((float(r["wer"]) for r in rows),
                                                     reverse=True)
    assert set(rows[0]) == {"id", "wer", "substitutions", "deletions", "insertions", "hits",
                            "reference", "hypothesis"}
    assert {r["id"] for r in rows} == {f"u{i}" for i in range(len(REFS))}


def test_caption_metrics_scores_transcripts():
    metrics = CaptionMetrics(metrics=["wer", "cer"], normalizer="whisper_basic")
    metrics.update(HYPS[:3], [[r] for r in REFS[:3]], keys=["a", "b", "c"])
    scores = metrics.compute()
    expected = error_rates(HYPS[:3], REFS[:3], normalizer="whisper_basic")
    assert scores == {"wer": pytest.approx(expected.wer), "cer": pytest.approx(expected.cer)}
    assert [e.id for e in metrics.errors] == ["a", "b", "c"]
    mixed = CaptionMetrics(metrics=["bleu", "wer"])
    mixed.update(["a dog barks"], [["a dog barks"]])
    assert set(mixed.compute()) == {"bleu_1", "bleu_2", "bleu_3", "bleu_4", "wer"}


def test_unknown_normalizer_fails_at_construction():
    with pytest.raises(ConfigError, match=r"model.wer_normalizer \('english'\)"):
        CaptionMetrics(metrics=["wer"], normalizer="english")
