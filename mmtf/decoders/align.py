"""Word-to-time alignment from cross-attention by dynamic time warping (Whisper's
``timing.find_alignment``, arXiv:2212.04356).

Cross-attention rows (one per token, eos last) over the valid positions are z-normalised over
tokens, median-filtered along time and averaged over layers and heads; the monotonic path of most
attention gives each token's start, and a word spans to the next word's start.

Shapes: h heads, n caption tokens (eos included), m memory positions (valid ones after trimming)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mmtf.errors import UserError


@dataclass(frozen=True)
class WordSpan:
    """One word of a caption and the audio it attends to.

    Attributes:
        word: the word as the tokenizer decodes it.
        start, end: seconds from the clip start (start <= end).
        tokens: indices of the word's tokens in the caption (0 = first generated token).
    """

    word: str
    start: float
    end: float
    tokens: tuple[int, ...]


def median_filter(x: Tensor, width: int) -> Tensor:
    """Running median of odd ``width`` along the last axis, reflect-padded: (..., m) -> (..., m).

    A width wider than the signal allows is narrowed to the widest odd width that fits.
    """
    if width < 1 or width % 2 == 0:
        raise UserError(f"median filter width ({width}) must be a positive odd number; set "
                        f"medfilt_width to 1 (off), 3, 5, 7 ...")
    m = x.shape[-1]
    width = min(width, m if m % 2 else m - 1)
    if width <= 1:
        return x
    pad = width // 2
    shape = x.shape
    flat = F.pad(x.reshape(-1, 1, m), (pad, pad), mode="reflect")          # (r, 1, m + 2 pad)
    return flat.unfold(-1, width, 1).median(dim=-1).values.reshape(shape)  # (..., m)


def token_time_matrix(weights: Tensor, *, medfilt_width: int = 7) -> Tensor:
    """Whisper's alignment matrix from stacked attention maps.

    Args:
        weights: (k, n, m) attention of k chosen (layer, head) pairs, valid positions only.
        medfilt_width: median filter along time (odd; 1 = off).

    Returns:
        (n, m) float64: per-position z-scores over tokens, filtered, averaged over the k maps.
    """
    w = weights.double()
    std, mean = torch.std_mean(w, dim=-2, keepdim=True, unbiased=False)    # (k, 1, m)
    w = (w - mean) / std.clamp_min(1e-12)
    return median_filter(w, medfilt_width).mean(dim=0)                    # (n, m)


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The monotonic path of least summed cost from (0, 0) to (n - 1, m - 1).

    Steps are (1, 1), (1, 0) and (0, 1); ties prefer the diagonal, then (1, 0). ``cost``: (n, m)
    float; returns (rows, cols), each (p,) int, the cells of the path in order.
    """
    n, m = cost.shape
    total = np.full((n + 1, m + 1), np.inf)
    total[0, 0] = 0.0
    step = np.zeros((n + 1, m + 1), dtype=np.int8)          # 0 diagonal, 1 down (i-1), 2 right
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            options = (total[i - 1, j - 1], total[i - 1, j], total[i, j - 1])
            k = int(np.argmin(options))                       # first minimum: diagonal first
            total[i, j] = cost[i - 1, j - 1] + options[k]
            step[i, j] = k
    rows, cols = [], []
    i, j = n, m
    while i > 0 and j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        k = step[i, j]
        i, j = (i - 1, j - 1) if k == 0 else (i - 1, j) if k == 1 else (i, j - 1)
    if i != 0 or j != 0:
        raise RuntimeError("dtw_path: the backtrace did not reach (0, 0)")
    return np.array(rows[::-1]), np.array(cols[::-1])


def token_starts(matrix: Tensor) -> np.ndarray:
    """The position where the DTW path through ``matrix`` (n, m) first enters each row, (n,)."""
    rows, cols = dtw_path(-matrix.cpu().numpy())
    first = np.full(matrix.shape[0], -1)
    for r, c in zip(rows, cols):
        if first[r] < 0:
            first[r] = c
    return first


def word_spans(weights: Tensor, words: Sequence[tuple[str, Sequence[int]]],
               seconds_per_position: float, *, duration: float | None = None,
               medfilt_width: int = 7) -> list[WordSpan]:
    """Align words to time from the cross-attention of one caption.

    Args:
        weights: (k, n, m) maps of the chosen (layer, head) pairs over the valid positions;
            row t produced caption token t, the last row eos.
        words: ``(word, token indices)`` in caption order (the eos row closes the last word).
        seconds_per_position: seconds between memory position centres.
        duration: clip length in seconds, to clip the last end; None = the memory's extent.
        medfilt_width: median filter width along time (odd; 1 = off).

    Returns:
        One :class:`WordSpan` per word, in order, never overlapping.
    """
    if weights.dim() != 3:
        raise ValueError(f"word_spans: weights must be (maps, tokens, positions), got "
                         f"{tuple(weights.shape)}.")
    n, m = weights.shape[-2:]
    if not words:
        return []
    starts = token_starts(token_time_matrix(weights, medfilt_width=medfilt_width))   # (n,)
    end_limit = m * seconds_per_position if duration is None else duration
    firsts = [int(starts[min(tokens)]) for _, tokens in words]
    last_token = max(words[-1][1])
    closing = int(starts[last_token + 1]) if last_token + 1 < n else m
    spans: list[WordSpan] = []
    for i, (word, tokens) in enumerate(words):
        begin = firsts[i]
        stop = max(firsts[i + 1] if i + 1 < len(words) else closing, begin + 1)   # exclusive
        # Words never overlap: several words whose tokens share a first position follow
        # each other there (zero-length after the first), as Whisper's do.
        start = max(0.0, (begin - 0.5) * seconds_per_position, spans[-1].end if spans else 0.0)
        end = min(end_limit, (stop - 0.5) * seconds_per_position)
        spans.append(WordSpan(word, start, max(start, end), tuple(int(t) for t in tokens)))
    return spans


def caption_words(tokenizer, token_ids: Sequence[int]) -> list[tuple[str, list[int]]]:
    """Group caption tokens into the words the tokenizer decodes them to.

    Token t belongs to the last word of ``decode(ids[:t + 1])``: a token that adds no word (the
    space of a character tokenizer) goes with the word before it, one before any word with the
    first word.

    ``token_ids``: the caption's ids without bos and eos; returns ``(word, token indices)`` per
    word of ``decode(token_ids).split()``.
    """
    words = tokenizer.decode(list(token_ids)).split()
    groups: list[list[int]] = [[] for _ in words]
    for t in range(len(token_ids) if words else 0):
        index = len(tokenizer.decode(list(token_ids[: t + 1])).split()) - 1
        groups[min(max(index, 0), len(words) - 1)].append(t)
    return [(w, g) for w, g in zip(words, groups) if g]
