"""BLEU, ROUGE-L and CIDEr-D against pycocoevalcap (the reference), torchmetrics and hand values."""

from __future__ import annotations

import contextlib
import io
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge
from torchmetrics.text import BLEUScore

from mmtf.metrics import (
    FAST_METRICS,
    caption_metrics,
    cider_d_scores,
    corpus_bleu,
    corpus_cider_d,
    corpus_rouge_l,
    ptb_words,
)
from tests.unit.metrics.fixtures import CANDIDATES, REFERENCES

KEYS = ["bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "cider_d"]


def pycoco(cands: list[list[str]], refs: list[list[list[str]]]) -> tuple[dict, list[float]]:
    """pycocoevalcap's scorers on the same tokenised text (dicts of space-joined strings)."""
    gts = {i: [" ".join(r) for r in rs] for i, rs in enumerate(refs)}
    res = {i: [" ".join(c)] for i, c in enumerate(cands)}
    with contextlib.redirect_stdout(io.StringIO()):
        bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, cider_items = Cider().compute_score(gts, res)
    rouge, _ = Rouge().compute_score(gts, res)
    scores = {f"bleu_{k + 1}": bleu[k] for k in range(4)}
    scores |= {"rouge_l": float(rouge), "cider_d": float(cider)}
    return scores, [float(x) for x in cider_items]


def tokenised_fixture():
    return ([ptb_words(c) for c in CANDIDATES],
            [[ptb_words(r) for r in refs] for refs in REFERENCES])


def test_fixture_shape():
    assert len(CANDIDATES) == len(REFERENCES) >= 20
    assert all(len(refs) == 5 for refs in REFERENCES)


def test_matches_pycocoevalcap_on_fixture():
    cands, refs = tokenised_fixture()
    expected, expected_items = pycoco(cands, refs)
    got = caption_metrics(CANDIDATES, REFERENCES, metrics=FAST_METRICS)
    assert set(got) == set(KEYS)
    diffs = {k: abs(got[k] - expected[k]) for k in KEYS}
    assert max(diffs.values()) <= 1e-6, diffs
    items = cider_d_scores(cands, refs)
    assert max(abs(a - b) for a, b in zip(items, expected_items)) <= 1e-6
    # The fixture exercises the whole range: perfect, partial and zero CIDEr-D items.
    assert max(items) > 3 and min(items) == 0 and 0.2 < got["bleu_4"] < 0.9


RANDOM_VOCAB = ["a", "the", "dog", "cat", "barks", "runs", "man", "car", "rain", "on", "in"]


@settings(max_examples=60, deadline=None)
@given(st.lists(
    st.tuples(st.lists(st.sampled_from(RANDOM_VOCAB), max_size=9),
              st.lists(st.lists(st.sampled_from(RANDOM_VOCAB), min_size=1, max_size=9),
                       min_size=1, max_size=5)),
    min_size=1, max_size=8))
def test_matches_pycocoevalcap_on_random_corpora(corpus):
    """Differential test: empty and one-word candidates, 1 to 5 references, 1 to 8 items."""
    cands = [c for c, _ in corpus]
    refs = [r for _, r in corpus]
    expected, expected_items = pycoco(cands, refs)
    got = corpus_bleu(cands, refs)
    for k in range(4):
        assert got[k] == pytest.approx(expected[f"bleu_{k + 1}"], abs=1e-9)
    assert corpus_rouge_l(cands, refs) == pytest.approx(expected["rouge_l"], abs=1e-9)
    assert cider_d_scores(cands, refs) == pytest.approx(expected_items, abs=1e-9)


def test_bleu_matches_torchmetrics():
    """torchmetrics' corpus BLEU agrees when its tie-break (first closest ref) equals COCO's
    (shortest closest ref), i.e. with references sorted by length, and precisions are > 0."""
    cands, refs = tokenised_fixture()
    keep = [i for i, c in enumerate(cands) if len(c) >= 4]
    preds = [" ".join(cands[i]) for i in keep]
    target = [sorted((" ".join(r) for r in refs[i]), key=lambda s: len(s.split())) for i in keep]
    ours = corpus_bleu([cands[i] for i in keep], [refs[i] for i in keep])
    for n in range(1, 5):
        theirs = BLEUScore(n_gram=n)(preds, target)
        assert ours[n - 1] == pytest.approx(theirs.item(), abs=1e-6)


def test_hand_computed_bleu_and_rouge():
    cand, refs = ["a", "dog", "barks"], [["a", "dog", "barks", "loudly"]]
    # matched / guessed n-grams: 3/3, 2/2, 1/1, 0/0, smoothed as pycocoevalcap does
    q = [(c + 1e-15) / (g + 1e-9) for c, g in [(3, 3), (2, 2), (1, 1), (0, 0)]]
    bp = math.exp(1 - (4 + 1e-9) / (3 + 1e-15))  # c = 3 < r = 4
    expected = [math.prod(q[:k]) ** (1 / k) * bp for k in range(1, 5)]
    assert expected[3] == pytest.approx((1e-6) ** 0.25 * math.exp(-1 / 3), rel=1e-6)
    assert corpus_bleu([cand], [refs]) == pytest.approx(expected, rel=1e-12)
    # LCS 3: P = 1, R = 3/4; F = (1 + 1.44) P R / (R + 1.44 P)
    assert corpus_rouge_l([cand], [refs]) == pytest.approx(2.44 * 0.75 / (0.75 + 1.44), rel=1e-12)


def test_hand_computed_cider_d():
    """Two items, N = 2 so idf = ln 2 for every reference n-gram (each occurs in one item).

    Item 1: candidate == its reference "a b": cosine 1 for n = 1, 2; 0 for n = 3, 4 -> 10 * 2/4.
    Item 2: "c" vs "c d": unigram cosine ln2^2 / (ln2 * sqrt(2) ln2) = 1/sqrt(2); lengths in
    bigrams 0 vs 1 -> penalty exp(-1/72) -> 10 * (1/sqrt(2)) e^(-1/72) / 4.
    """
    cands = [["a", "b"], ["c"]]
    refs = [[["a", "b"]], [["c", "d"]]]
    item2 = 10 * math.exp(-1 / 72) / math.sqrt(2) / 4
    assert cider_d_scores(cands, refs) == pytest.approx([5.0, item2], rel=1e-12)
    assert corpus_cider_d(cands, refs) == pytest.approx((5.0 + item2) / 2, rel=1e-12)


def test_cider_d_clips_repeated_ngrams():
    """Repeating a matching word does not raise CIDEr-D (clipping), it lowers it."""
    refs = [[["a", "phone", "rings"]], [["a", "dog", "barks"]], [["rain", "falls"]]]
    base = cider_d_scores([["a", "phone", "rings"], ["x"], ["y"]], refs)[0]
    repeated = cider_d_scores([["a", "phone", "rings", "rings", "rings"], ["x"], ["y"]], refs)[0]
    assert repeated < base


def test_single_item_cider_d_is_zero():
    assert corpus_cider_d([["a", "dog"]], [[["a", "dog"]]]) == 0.0


WORD = st.sampled_from(RANDOM_VOCAB)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(WORD, min_size=4, max_size=10), min_size=1, max_size=6),
       st.integers(1, 5))
def test_identical_captions_score_one(sentences, n_refs):
    refs = [[s] * n_refs for s in sentences]
    bleu = corpus_bleu(sentences, refs)
    assert bleu == pytest.approx([1.0] * 4, abs=1e-6)
    assert corpus_rouge_l(sentences, refs) == pytest.approx(1.0, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(WORD, max_size=8),
                          st.lists(st.lists(WORD, min_size=1, max_size=8), min_size=1, max_size=4)),
                min_size=2, max_size=6),
       st.randoms(use_true_random=False))
def test_order_invariance_and_ranges(corpus, rnd):
    """Shuffling items, or references within an item, changes no corpus score."""
    cands, refs = [c for c, _ in corpus], [r for _, r in corpus]
    order = list(range(len(corpus)))
    rnd.shuffle(order)
    cands2 = [cands[i] for i in order]
    refs2 = [rnd.sample(refs[i], len(refs[i])) for i in order]
    for fn in (corpus_bleu, corpus_rouge_l, corpus_cider_d):
        assert fn(cands2, refs2) == pytest.approx(fn(cands, refs), abs=1e-12)
    assert all(0 <= b <= 1 + 1e-9 for b in corpus_bleu(cands, refs))
    assert 0 <= corpus_cider_d(cands, refs) <= 10 + 1e-9


def test_tokenize_false_uses_whitespace_split():
    raw = caption_metrics(["A dog."], [["a dog"]], metrics=["bleu_1"], tokenize=False)
    tok = caption_metrics(["A dog."], [["a dog"]], metrics=["bleu_1"])
    assert tok["bleu_1"] == pytest.approx(1.0, abs=1e-6)
    assert raw["bleu_1"] < 1e-3  # "A" != "a" and "dog." != "dog"


def test_scores_are_python_floats():
    scores = caption_metrics(CANDIDATES[:3], REFERENCES[:3], metrics=FAST_METRICS)
    assert all(type(v) is float for v in scores.values())
