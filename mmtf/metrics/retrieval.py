"""Cross-modal retrieval metrics: recall at k and mean average precision at k, both directions.

Each query (a caption, or a clip / image) ranks every candidate of the other modality by
similarity; ``relevant[q, j]`` says which candidates are right.

- ``R@k``: the share of queries with a relevant candidate among their first k.
- ``mAP@k``: the mean over queries of ``AP@k = (1 / R) * sum over relevant candidates at rank
  r <= k of (relevant candidates at ranks <= r) / r``, R = the query's relevant count (all of
  them, also when R > k). With one relevant candidate (a caption query: its own clip) this is
  ``1 / rank`` if rank <= 10 else 0, DCASE 2024 task 8's mAP@10; with several it is the
  ``average_precision_at_k`` of the DCASE 2025 task 6 baseline (its mAP@16 divides by the
  relevant count too, which equals ``min(R, 16)`` whenever R <= 16, as in its data).

Ties rank pessimistically: among candidates with equal scores the irrelevant ones rank first,
then the relevant ones by index. So a model whose embeddings collapse (every score equal) scores
as badly as possible rather than perfectly, and no metric depends on the order of the candidates
(nor on how DDP ranks split the set). Why: docs/design/contrastive-loss.md.

Shapes: q queries, n candidates, e embedding width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

__all__ = ["MAP_AT", "RECALL_AT", "RetrievalMetrics", "chance_metrics", "ranked_relevance",
           "retrieval_metrics"]

RECALL_AT: tuple[int, ...] = (1, 5, 10)
MAP_AT: tuple[int, ...] = (10, 16)
CHUNK = 1024          # queries scored at once: bounds the (chunk, n) sort buffers


def ranked_relevance(scores: Tensor, relevant: Tensor, depth: int | None = None) -> Tensor:
    """Each query's candidates in ranked order, as relevance flags.

    Order: descending score; equal scores put the irrelevant candidates first, then the
    relevant ones, each by index (two stable sorts).

    Args:
        scores: (q, n) float; relevant: (q, n) bool.
        depth: keep the first ``depth`` ranks (None = all n).

    Returns:
        (q, depth) bool, ``[i, r]`` = the candidate at rank r + 1 of query i is relevant.
    """
    by_relevance = torch.sort(relevant.to(torch.uint8), dim=1, stable=True).indices  # (q, n)
    by_score = torch.sort(scores.gather(1, by_relevance), dim=1, descending=True,
                          stable=True).indices                                      # (q, n)
    ranked = relevant.gather(1, by_relevance.gather(1, by_score))                   # (q, n)
    return ranked if depth is None else ranked[:, :depth]


def _sums(scores: Tensor, relevant: Tensor, recall_at: Sequence[int],
          map_at: Sequence[int]) -> dict[str, Tensor]:
    """Per-metric sums over the queries of one chunk (float64)."""
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("retrieval_metrics: the scores hold NaN or inf; the embeddings are not "
                         "finite (a diverged model?).")
    count = relevant.sum(dim=1)                                                     # (q,)
    if not bool((count > 0).all()):
        raise ValueError(f"retrieval_metrics: query {int((count == 0).nonzero()[0])} (of this "
                         f"chunk) has no relevant candidate; every query needs one.")
    depth = max((*recall_at, *map_at))
    hits = ranked_relevance(scores, relevant, depth).double()                       # (q, k)
    out = {f"R@{k}": hits[:, :k].amax(dim=1).sum() for k in recall_at}
    ranks = torch.arange(1, hits.shape[1] + 1, dtype=hits.dtype, device=hits.device)
    precision = hits.cumsum(dim=1) / ranks                                          # (q, k)
    for k in map_at:
        ap = (precision[:, :k] * hits[:, :k]).sum(dim=1) / count.double()           # (q,)
        out[f"mAP@{k}"] = ap.sum()
    return out


def retrieval_metrics(scores: Tensor, relevant: Tensor, *,
                      recall_at: Sequence[int] = RECALL_AT,
                      map_at: Sequence[int] = MAP_AT) -> dict[str, float]:
    """``R@k`` and ``mAP@k`` (module docstring) of queries over candidates.

    Args:
        scores: (q, n) similarity of each query to each candidate.
        relevant: (q, n) bool, at least one True per query.

    Returns:
        ``{"R@1": .., "R@5": .., "R@10": .., "mAP@10": .., "mAP@16": ..}`` in [0, 1].

    Raises:
        ValueError: shapes differ, no query, a query without a relevant candidate, or
            non-finite scores.
    """
    if scores.dim() != 2 or relevant.shape != scores.shape or relevant.dtype != torch.bool:
        raise ValueError(f"retrieval_metrics: scores (q, n) and a bool relevant of the same "
                         f"shape, got {tuple(scores.shape)} and {relevant.dtype} "
                         f"{tuple(relevant.shape)}.")
    if scores.shape[0] == 0:
        raise ValueError("retrieval_metrics: no query to score.")
    total: dict[str, Tensor] = {}
    for start in range(0, scores.shape[0], CHUNK):
        part = _sums(scores[start:start + CHUNK], relevant[start:start + CHUNK], recall_at, map_at)
        total = {k: total.get(k, 0.0) + v for k, v in part.items()}
    return {k: float(v) / scores.shape[0] for k, v in total.items()}


def chance_metrics(relevant_counts: Tensor, candidates: int, *,
                   recall_at: Sequence[int] = RECALL_AT,
                   map_at: Sequence[int] = MAP_AT) -> dict[str, float]:
    """The expected ``R@k`` and ``mAP@k`` of a ranking drawn uniformly at random: chance level.

    A query with R relevant among N candidates has, at rank r, a relevant candidate with
    probability R / N, and given that, r - 1 others above it of which (R - 1) / (N - 1) are
    relevant on average. So ``E[R@k] = 1 - C(N - R, k) / C(N, k)`` and
    ``E[AP@k] = (1 / R) * sum_{r <= k} (R / N) * (1 + (r - 1)(R - 1) / (N - 1)) / r``.

    Args:
        relevant_counts: (q,) each query's relevant count R (>= 1).
        candidates: N, the candidates every query ranks.

    Returns:
        ``{"R@1": .., ..., "mAP@16": ..}``, each averaged over the queries.
    """
    n = int(candidates)
    count = relevant_counts.double()                                                # (q,)
    if count.numel() == 0 or n < 1 or bool((count < 1).any()) or bool((count > n).any()):
        raise ValueError(f"chance_metrics: every query needs 1 <= R <= N = {n} relevant "
                         f"candidates.")
    out: dict[str, float] = {}
    for k in recall_at:
        # C(N - R, k) / C(N, k) = prod_{i < k} (N - R - i) / (N - i): no large factorials.
        i = torch.arange(min(k, n), dtype=torch.float64)                             # (k,)
        miss = ((n - count[:, None] - i) / (n - i)).clamp_min(0.0).prod(dim=1)       # (q,)
        out[f"R@{k}"] = float((1.0 - miss).mean())
    for k in map_at:
        r = torch.arange(1, min(k, n) + 1, dtype=torch.float64)                      # (k,)
        others = (count[:, None] - 1) / (n - 1) if n > 1 else torch.zeros_like(count[:, None])
        precision = (1.0 + (r - 1) * others) / r                                     # (q, k)
        out[f"mAP@{k}"] = float(((precision / n).sum(dim=1)).mean())
    return out


class RetrievalMetrics(Metric):
    """Retrieval both ways over a whole evaluation set, gathered across ranks at epoch end.

    ``update`` takes a batch's media embeddings with their item keys and its captions'
    embeddings with their item's key and their index among the item's captions; ``compute``
    gathers every rank's rows, drops repeats (an item DDP's sampler padding put on two ranks),
    scores cosine similarities and returns ``text_to_<media>/<metric>`` (each caption queries
    the clips, its own relevant) and ``<media>_to_text/<metric>`` (each clip queries the
    captions, all of its own relevant), each with ``.../chance/<metric>``: what a random
    ranking scores on the same relevance (:func:`chance_metrics`).

    Relevance: by default a candidate is relevant when it has the query's item key. With
    ``media_groups`` / ``text_groups`` (one relevance key per row) every candidate of the
    query's group is: on the built-in sets, clips with the same event sequence, whose
    captions are interchangeable. The item keys still identify rows (repeats are dropped by
    them).

    Args:
        media: the media's name in the metric names ("audio", "image").
        recall_at, map_at: the k of ``R@k`` and ``mAP@k``.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, *, media: str = "media", recall_at: Sequence[int] = RECALL_AT,
                 map_at: Sequence[int] = MAP_AT, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.media, self.recall_at, self.map_at = media, tuple(recall_at), tuple(map_at)
        for name in ("media_emb", "media_keys", "text_emb", "text_keys", "text_slots",
                     "media_groups", "text_groups"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, media_emb: Tensor, media_keys: Tensor, text_emb: Tensor, text_keys: Tensor,
               text_slots: Tensor, media_groups: Tensor | None = None,
               text_groups: Tensor | None = None) -> None:
        """media_emb (b, e), media_keys (b,); text_emb (t, e), text_keys (t,), text_slots (t,);
        media_groups (b,) and text_groups (t,): relevance keys (None: the item keys)."""
        if (media_groups is None) != (text_groups is None):
            raise ValueError("RetrievalMetrics.update: pass both media_groups and text_groups, "
                             "or neither.")
        media_groups = media_keys if media_groups is None else media_groups
        text_groups = text_keys if text_groups is None else text_groups
        if media_keys.shape != media_emb.shape[:1] or text_keys.shape != text_emb.shape[:1] \
                or text_slots.shape != text_keys.shape or media_groups.shape != media_keys.shape \
                or text_groups.shape != text_keys.shape:
            raise ValueError(f"RetrievalMetrics.update: one key per row: media "
                             f"{tuple(media_emb.shape)} / {tuple(media_keys.shape)}, text "
                             f"{tuple(text_emb.shape)} / {tuple(text_keys.shape)} / "
                             f"{tuple(text_slots.shape)}, groups {tuple(media_groups.shape)} / "
                             f"{tuple(text_groups.shape)}.")
        self.media_emb.append(media_emb.detach().float())
        self.media_keys.append(media_keys.long())
        self.text_emb.append(text_emb.detach().float())
        self.text_keys.append(text_keys.long())
        self.text_slots.append(text_slots.long())
        self.media_groups.append(media_groups.long())
        self.text_groups.append(text_groups.long())

    def compute(self) -> dict[str, Tensor]:
        media_keys, text_keys = dim_zero_cat(self.media_keys), dim_zero_cat(self.text_keys)
        text_slots = dim_zero_cat(self.text_slots)
        keep_m = _first_of_each(media_keys.tolist())
        keep_t = _first_of_each(list(zip(text_keys.tolist(), text_slots.tolist())))
        media = F.normalize(dim_zero_cat(self.media_emb)[keep_m], dim=-1)           # (M, e)
        text = F.normalize(dim_zero_cat(self.text_emb)[keep_t], dim=-1)             # (T, e)
        media_keys = dim_zero_cat(self.media_groups)[keep_m]                          # (M,)
        text_keys = dim_zero_cat(self.text_groups)[keep_t]                            # (T,)
        out: dict[str, Tensor] = {}
        for name, queries, q_keys, items, i_keys in (
                (f"text_to_{self.media}", text, text_keys, media, media_keys),
                (f"{self.media}_to_text", media, media_keys, text, text_keys)):
            total: dict[str, Tensor] = {}
            for start in range(0, queries.shape[0], CHUNK):
                scores = queries[start:start + CHUNK] @ items.T                     # (c, n)
                relevant = q_keys[start:start + CHUNK, None] == i_keys[None, :]     # (c, n)
                part = _sums(scores, relevant, self.recall_at, self.map_at)
                total = {k: total.get(k, 0.0) + v for k, v in part.items()}
            out.update({f"{name}/{k}": (v / queries.shape[0]).float() for k, v in total.items()})
            # Each query's relevant count: how many candidates share its group.
            groups, sizes = torch.unique(i_keys, return_counts=True)
            at = torch.searchsorted(groups, q_keys).clamp_max(groups.numel() - 1)
            counts = sizes[at]                   # (q,); every query has one (_sums checked it)
            chance = chance_metrics(counts, items.shape[0], recall_at=self.recall_at,
                                    map_at=self.map_at)
            out.update({f"{name}/chance/{k}": torch.tensor(v) for k, v in chance.items()})
        return out


def _first_of_each(keys: list[Any]) -> Tensor:
    """Indices of the first occurrence of each distinct key, in order."""
    seen: dict[Any, int] = {}
    for i, key in enumerate(keys):
        seen.setdefault(key, i)
    return torch.tensor(list(seen.values()), dtype=torch.long)
