"""Retrieval metrics on hand-worked similarity matrices: every rank, tie and value below is
worked out in the comments, not computed by the code under test."""

from __future__ import annotations

from datetime import timedelta
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mmtf.losses import item_keys
from mmtf.metrics.retrieval import (
    RetrievalMetrics,
    chance_metrics,
    ranked_relevance,
    retrieval_metrics,
)

N = 20                                   # candidates, so the cut-offs at 10 and 16 matter


def _rows(spec: list[tuple[list[float], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.tensor([s for s, _ in spec], dtype=torch.float32)
    relevant = torch.zeros(scores.shape, dtype=torch.bool)
    for i, (_, rel) in enumerate(spec):
        relevant[i, rel] = True
    return scores, relevant


DESC = [float(N - j) for j in range(N)]  # candidate j scores N - j: it ranks j + 1


def test_one_relevant_item_per_query_dcase_2024():
    tied_top = list(DESC)
    tied_top[2] = tied_top[0]            # relevant 2 ties irrelevant 0 at the top
    scores, relevant = _rows([
        (DESC, [0]),                     # rank 1:  R@1 R@5 R@10 hit, AP 1
        (DESC, [3]),                     # rank 4:  R@5 R@10 hit, AP 1/4
        (DESC, [11]),                    # rank 12: no hit at 10, AP@10 0, AP@16 1/12
        (tied_top, [2]),                 # tie: the irrelevant one first -> rank 2, AP 1/2
        ([1.0] * N, [0]),                # all equal (collapsed): rank 20, nothing
    ])
    got = retrieval_metrics(scores, relevant)
    assert got["R@1"] == pytest.approx(1 / 5)
    assert got["R@5"] == pytest.approx(3 / 5)
    assert got["R@10"] == pytest.approx(3 / 5)
    assert got["mAP@10"] == pytest.approx((1 + 1 / 4 + 0 + 1 / 2 + 0) / 5)           # 0.35
    assert got["mAP@16"] == pytest.approx((1 + 1 / 4 + 1 / 12 + 1 / 2 + 0) / 5)      # 0.3667


def test_several_relevant_items_per_query_dcase_2025():
    tied = list(DESC)
    tied[1] = tied[2] = tied[3] = tied[0]           # candidates 0-3 tie at the top
    # q3: 18 relevant candidates 2..19 at ranks 3..20; at rank r the hits so far are r - 2.
    ap16_q3 = sum(Fraction(r - 2, r) for r in range(3, 17)) / 18    # ranks 3..16: 10.2385 / 18
    ap10_q3 = sum(Fraction(r - 2, r) for r in range(3, 11)) / 18    # ranks 3..10: 5.1421 / 18
    scores, relevant = _rows([
        (DESC, [0, 2, 5]),          # ranks 1, 3, 6: (1/1 + 2/3 + 3/6) / 3 = 13/18
        (DESC, [4, 12, 17]),        # ranks 5, 13, 18: @10 (1/5) / 3 = 1/15;
                                    #                  @16 (1/5 + 2/13) / 3 = 23/195
        (tied, [1, 2]),             # ties: irrelevant 0, 3 rank 1, 2; relevant 1, 2 rank 3, 4:
                                    # (1/3 + 2/4) / 2 = 5/12
        (DESC, list(range(2, 20))),  # R = 18 > 16: AP@16 still divides by 18
    ])
    got = retrieval_metrics(scores, relevant)
    assert got["R@1"] == pytest.approx(1 / 4)
    assert got["R@5"] == pytest.approx(1.0)
    assert got["mAP@10"] == pytest.approx(float(
        (Fraction(13, 18) + Fraction(1, 15) + Fraction(5, 12) + ap10_q3) / 4))
    assert got["mAP@16"] == pytest.approx(float(
        (Fraction(13, 18) + Fraction(23, 195) + Fraction(5, 12) + ap16_q3) / 4))


def test_the_tie_rule_makes_the_metrics_independent_of_the_candidates_order():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (30, N), generator=g).float()      # many ties
    relevant = torch.rand(30, N, generator=g) < 0.2
    relevant[:, 0] = True
    want = retrieval_metrics(scores, relevant)
    for _ in range(3):
        perm = torch.randperm(N, generator=g)
        assert retrieval_metrics(scores[:, perm], relevant[:, perm]) == pytest.approx(want)


def test_ranked_relevance_puts_tied_relevant_candidates_last():
    # scores 5, 5, 5, 1: relevant at 0 and 2 tie irrelevant 1 -> ranked: 1 (irr), 0, 2, 3
    flags = ranked_relevance(torch.tensor([[5.0, 5.0, 5.0, 1.0]]),
                             torch.tensor([[True, False, True, False]]))
    assert flags.tolist() == [[False, True, True, False]]


def test_bad_inputs_are_refused():
    scores, relevant = _rows([(DESC, [0]), (DESC, [])])
    with pytest.raises(ValueError, match="query 1 .* no relevant candidate"):
        retrieval_metrics(scores, relevant)
    scores, relevant = _rows([(DESC, [0])])
    scores[0, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        retrieval_metrics(scores, relevant)


# Three clips a, b, c and four captions (2-D unit vectors, cosine = dot product):
#   a = (1, 0), b = (0, 1), c = (-1, 0)
#   a/0 = (1, 0)        scores a 1,  b 0,   c -1   -> its clip a at rank 1
#   a/1 = (.6, .8)      scores a .6, b .8,  c -.6  -> a at rank 2
#   b/0 = (0, 1)        scores a 0,  b 1,   c 0    -> b at rank 1
#   c/0 = (.8, -.6)     scores a .8, b -.6, c -.8  -> c at rank 3
# text -> audio: R@1 2/4, R@5 1, mAP@10 (1 + 1/2 + 1 + 1/3) / 4 = 17/24
# audio -> text:
#   a: a/0 1, c/0 .8, a/1 .6, b/0 0      -> relevant at ranks 1, 3: (1 + 2/3) / 2 = 5/6
#   b: b/0 1, a/1 .8, a/0 0, c/0 -.6     -> rank 1: 1
#   c: b/0 0, a/1 -.6, c/0 -.8, a/0 -1   -> rank 3: 1/3
#   R@1 2/3, mAP@10 (5/6 + 1 + 1/3) / 3 = 13/18
CLIPS = {"a": (1.0, 0.0), "b": (0.0, 1.0), "c": (-1.0, 0.0)}
CAPTIONS = [("a", 0, (1.0, 0.0)), ("a", 1, (0.6, 0.8)), ("b", 0, (0.0, 1.0)),
            ("c", 0, (0.8, -0.6))]


def _update(metric: RetrievalMetrics, clips: list[str]) -> None:
    rows = [c for c in CAPTIONS if c[0] in clips]
    metric.update(torch.tensor([CLIPS[c] for c in clips]), item_keys(clips),
                  torch.tensor([r[2] for r in rows]), item_keys([r[0] for r in rows]),
                  torch.tensor([r[1] for r in rows]))


def test_metric_scores_both_directions_over_the_whole_set():
    metric = RetrievalMetrics(media="audio")
    _update(metric, ["a", "b"])
    _update(metric, ["c", "a"])          # "a" again (DDP sampler padding): counted once
    got = {k: float(v) for k, v in metric.compute().items()}
    assert got["text_to_audio/R@1"] == pytest.approx(2 / 4)
    assert got["text_to_audio/R@5"] == pytest.approx(1.0)
    assert got["text_to_audio/mAP@10"] == pytest.approx(17 / 24)
    assert got["audio_to_text/R@1"] == pytest.approx(2 / 3)
    assert got["audio_to_text/mAP@10"] == pytest.approx(13 / 18)
    assert set(got) == {f"{d}/{c}{m}" for d in ("text_to_audio", "audio_to_text")
                        for m in ("R@1", "R@5", "R@10", "mAP@10", "mAP@16")
                        for c in ("", "chance/")}
    # chance, text -> audio: N = 3 clips, R = 1: E[R@1] = 1/3, E[R@5] = 1 (5 >= N),
    #   E[AP@10] = (1/1 + 1/2 + 1/3) / 3 = 11/18 (the relevant clip at each rank alike).
    assert got["text_to_audio/chance/R@1"] == pytest.approx(1 / 3)
    assert got["text_to_audio/chance/R@5"] == pytest.approx(1.0)
    assert got["text_to_audio/chance/mAP@10"] == pytest.approx(11 / 18)
    # audio -> text: N = 4 captions; b and c have R = 1: E[AP] = (1 + 1/2 + 1/3 + 1/4) / 4
    #   = 25/48; a has R = 2, 6 equally likely rank pairs {i, j}, AP = (1/i + 2/j) / 2:
    #   {1,2} 1, {1,3} 5/6, {1,4} 3/4, {2,3} 7/12, {2,4} 1/2, {3,4} 5/12 -> 49/72.
    #   E[R@1] = (2/4 + 1/4 + 1/4) / 3 = 1/3; mAP@10 (49/72 + 2 * 25/48) / 3 = 31/54.
    assert got["audio_to_text/chance/R@1"] == pytest.approx(1 / 3)
    assert got["audio_to_text/chance/mAP@10"] == pytest.approx(31 / 54)


def test_relevance_groups_make_every_clip_of_a_group_relevant():
    # The set above with a and c in one relevance group (same event sequence), b alone.
    # text -> audio (relevant: a and c for a/0, a/1, c/0; b for b/0):
    #   a/0: a 1, b 0, c -1     -> a rank 1, c rank 3: (1 + 2/3) / 2 = 5/6, R@1 hit
    #   a/1: b .8, a .6, c -.6  -> a rank 2, c rank 3: (1/2 + 2/3) / 2 = 7/12, miss
    #   b/0: b 1 first          -> 1, hit
    #   c/0: a .8, b -.6, c -.8 -> a rank 1, c rank 3: 5/6, hit
    #   R@1 3/4, mAP@10 (5/6 + 7/12 + 1 + 5/6) / 4 = 13/16
    # audio -> text (a and c: captions a/0, a/1, c/0 relevant):
    #   a: a/0 1, c/0 .8, a/1 .6, b/0 0      -> ranks 1, 2, 3: 1
    #   b: b/0 first                         -> 1
    #   c: b/0 0, a/1 -.6, c/0 -.8, a/0 -1   -> ranks 2, 3, 4: (1/2 + 2/3 + 3/4) / 3 = 23/36
    #   R@1 2/3, mAP@10 (1 + 1 + 23/36) / 3 = 95/108
    # chance text -> audio: N = 3; R = 2 (3 captions): pairs {1,2} 1, {1,3} 5/6, {2,3} 7/12
    #   -> 29/36, E[R@1] 2/3; R = 1 (b/0): 11/18, 1/3.
    #   mAP@10 (3 * 29/36 + 11/18) / 4 = 109/144; R@1 (3 * 2/3 + 1/3) / 4 = 7/12
    group = {"a": 1, "b": 2, "c": 1}
    metric = RetrievalMetrics(media="audio")
    for clips in (["a", "b"], ["c", "a"]):            # "a" twice: counted once
        rows = [c for c in CAPTIONS if c[0] in clips]
        metric.update(torch.tensor([CLIPS[c] for c in clips]), item_keys(clips),
                      torch.tensor([r[2] for r in rows]), item_keys([r[0] for r in rows]),
                      torch.tensor([r[1] for r in rows]),
                      torch.tensor([group[c] for c in clips]),
                      torch.tensor([group[r[0]] for r in rows]))
    got = {k: float(v) for k, v in metric.compute().items()}
    assert got["text_to_audio/R@1"] == pytest.approx(3 / 4)
    assert got["text_to_audio/mAP@10"] == pytest.approx(13 / 16)
    assert got["audio_to_text/R@1"] == pytest.approx(2 / 3)
    assert got["audio_to_text/mAP@10"] == pytest.approx(95 / 108)
    assert got["text_to_audio/chance/mAP@10"] == pytest.approx(109 / 144)
    assert got["text_to_audio/chance/R@1"] == pytest.approx(7 / 12)
    with pytest.raises(ValueError, match="both media_groups and text_groups"):
        metric.update(torch.zeros(1, 2), item_keys(["a"]), torch.zeros(1, 2), item_keys(["a"]),
                      torch.zeros(1), torch.ones(1))


@pytest.mark.parametrize(("n", "r"), [(6, 1), (6, 2), (7, 3), (5, 5)])
def test_chance_level_is_the_mean_over_every_ranking(n, r):
    # The reference: every placement of the r relevant candidates among n ranks, equally
    # likely, scored by a plain loop (AP@k = sum of precision at each hit / r; R@k = any hit).
    from itertools import combinations

    placements = list(combinations(range(1, n + 1), r))
    expected = {}
    for k in (1, 5, 10):
        expected[f"R@{k}"] = Fraction(sum(p[0] <= k for p in placements), len(placements))
    for k in (10, 16):
        total = Fraction(0)
        for p in placements:
            total += sum(Fraction(i + 1, rank) for i, rank in enumerate(p) if rank <= k) / r
        expected[f"mAP@{k}"] = total / len(placements)
    got = chance_metrics(torch.tensor([r, r]), n)
    for name, value in expected.items():
        assert got[name] == pytest.approx(float(value)), name


def _rank(rank: int, store: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        metric = RetrievalMetrics(media="audio")
        # rank 0 holds a, b, c; rank 1 a again (the sampler's padding): 3 + 1 clips, 4 + 2
        # captions (torchmetrics pads the uneven gathers)
        _update(metric, [["a", "b", "c"], ["a"]][rank])
        torch.save(metric.compute(), Path(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_gloo_ranks_score_the_whole_set_once(tmp_path):
    # forked, not spawned: two new interpreters would spend ~10 s importing torch before gloo
    mp.start_processes(_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                       start_method="fork")
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for scores in got:                               # the hand-worked values above, each rank
        assert float(scores["text_to_audio/mAP@10"]) == pytest.approx(17 / 24)
        assert float(scores["audio_to_text/mAP@10"]) == pytest.approx(13 / 18)
        assert float(scores["audio_to_text/R@1"]) == pytest.approx(2 / 3)
