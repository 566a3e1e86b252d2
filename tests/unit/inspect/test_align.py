"""DTW word alignment against hand-made attention with a known path and brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.ndimage
import torch

from mmtf.decoders.align import (
    caption_words,
    dtw_path,
    median_filter,
    token_starts,
    token_time_matrix,
    word_spans,
)
from mmtf.errors import UserError


def all_monotonic_paths(n: int, m: int):
    """Every path from (0, 0) to (n-1, m-1) with steps (1, 1), (1, 0), (0, 1) (brute force)."""
    def extend(path):
        i, j = path[-1]
        if (i, j) == (n - 1, m - 1):
            yield path
            return
        for di, dj in ((1, 1), (1, 0), (0, 1)):
            if i + di < n and j + dj < m:
                yield from extend([*path, (i + di, j + dj)])
    yield from extend([(0, 0)])


def test_dtw_follows_a_hand_made_path():
    path = [(0, 0), (0, 1), (1, 2), (2, 3), (2, 4), (2, 5), (3, 6), (4, 7)]
    cost = np.ones((5, 8))
    for i, j in path:
        cost[i, j] = 0.0
    rows, cols = dtw_path(cost)
    assert list(zip(rows.tolist(), cols.tolist())) == path


@pytest.mark.parametrize("seed", range(6))
def test_dtw_cost_is_the_brute_force_minimum(seed):
    rng = np.random.default_rng(seed)
    cost = rng.random((3, 5))
    rows, cols = dtw_path(cost)
    best = min(sum(cost[i, j] for i, j in p) for p in all_monotonic_paths(3, 5))
    assert cost[rows, cols].sum() == pytest.approx(best, abs=1e-12)
    steps = set(zip(np.diff(rows).tolist(), np.diff(cols).tolist()))
    assert steps <= {(1, 1), (1, 0), (0, 1)} and (rows[0], cols[0]) == (0, 0)


def test_median_filter_matches_scipy_with_mirror_edges():
    x = torch.randn(2, 3, 17, dtype=torch.float64)
    expected = scipy.ndimage.median_filter(x.numpy(), size=(1, 1, 5), mode="mirror")
    np.testing.assert_allclose(median_filter(x, 5).numpy(), expected)
    with pytest.raises(UserError, match="width \\(4\\) must be a positive odd number"):
        median_filter(x, 4)


def block_attention(blocks: list[range], m: int, heads: int = 2) -> torch.Tensor:
    """(heads, n, m): row t puts most of its weight on positions ``blocks[t]``."""
    w = torch.full((heads, len(blocks), m), 0.01)
    for t, block in enumerate(blocks):
        w[:, t, list(block)] = 1.0
    return w / w.sum(-1, keepdim=True)


def test_token_starts_are_where_each_row_takes_over():
    blocks = [range(0, 6), range(6, 9), range(9, 12), range(12, 16), range(16, 20)]
    matrix = token_time_matrix(block_attention(blocks, 20), medfilt_width=1)
    assert matrix.shape == (5, 20)
    starts = token_starts(matrix)
    assert starts.tolist() == [0, 6, 9, 12, 16]


def test_word_spans_from_a_known_alignment():
    # tokens: w0 = [0], w1 = [1, 2], w2 = [3], row 4 = eos; 40 ms per position
    blocks = [range(0, 6), range(6, 9), range(9, 12), range(12, 16), range(16, 20)]
    words = [("a", [0]), ("loud", [1, 2]), ("beep", [3])]
    spans = word_spans(block_attention(blocks, 20), words, 0.04, duration=0.8, medfilt_width=1)
    # word = positions [first, next word's first); edges half a position around the centres
    expected = [("a", 0.0, 5.5 * 0.04), ("loud", 5.5 * 0.04, 11.5 * 0.04),
                ("beep", 11.5 * 0.04, 15.5 * 0.04)]
    for span, (word, start, end) in zip(spans, expected, strict=True):
        assert (span.word, span.start, span.end) == (word, pytest.approx(start),
                                                     pytest.approx(end))
    assert [s.tokens for s in spans] == [(0,), (1, 2), (3,)]
    smoothed = word_spans(block_attention(blocks, 20), words, 0.04, duration=0.8,
                          medfilt_width=3)
    assert [(s.start, s.end) for s in smoothed] == [(s.start, s.end) for s in spans]


def test_a_caption_cut_at_the_length_limit_ends_at_the_clip_end():
    blocks = [range(0, 5), range(5, 10)]                  # two tokens, no eos row
    spans = word_spans(block_attention(blocks, 10), [("hiss", [0]), ("hum", [1])], 0.1,
                       duration=0.97, medfilt_width=1)
    assert spans[1].start == pytest.approx(0.45) and spans[1].end == pytest.approx(0.95)


class PieceTokenizer:
    """decode = concatenated pieces, like a BPE whose pieces carry their leading space."""

    pieces = {5: "a", 6: " lo", 7: "ud", 8: " be", 9: "ep", 10: ".", 11: " "}

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_tokens_are_grouped_into_the_decoded_words():
    assert caption_words(PieceTokenizer(), [5, 6, 7, 8, 9, 10]) == [
        ("a", [0]), ("loud", [1, 2]), ("beep.", [3, 4, 5])]
    # a bare space token adds no word: it stays with the word before it
    assert caption_words(PieceTokenizer(), [5, 11, 7]) == [("a", [0, 1]), ("ud", [2])]
    assert caption_words(PieceTokenizer(), []) == []


def test_brute_force_helper_counts_paths():
    # Delannoy numbers: D(2, 2) = 13 paths through a 3 x 3 grid
    assert sum(1 for _ in all_monotonic_paths(3, 3)) == 13
    assert len(list(itertools.islice(all_monotonic_paths(1, 4), 5))) == 1
