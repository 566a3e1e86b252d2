"""Collate padding and the length-bucketing batch sampler (determinism, DDP shards, policies)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from mmtf.data import BucketBatchSampler, Collate, padding_fraction
from mmtf.errors import UserError


# ------------------------------------------------------------------ collate
def test_audio_caption_collate_pads_and_reports_lengths():
    examples = [{"audio": torch.ones(3), "tokens": np.array([1, 7, 2]), "references": ("x", "y"),
                 "id": "a", "_skipped": [("non_finite", "b.wav")]},
                {"audio": torch.full((5,), 2.0), "tokens": [1, 2], "references": ("z",),
                 "id": "c", "_skipped": []}]
    batch = Collate(modality="audio", targets="caption")(examples)
    assert batch["audio"].tolist() == [[1, 1, 1, 0, 0], [2, 2, 2, 2, 2]]
    assert batch["audio"].dtype == torch.float32 and batch["audio_lengths"].tolist() == [3, 5]
    assert batch["tokens"].tolist() == [[1, 7, 2], [1, 2, 0]]
    assert batch["tokens"].dtype == torch.long and batch["token_lengths"].tolist() == [3, 2]
    assert batch["references"] == [["x", "y"], ["z"]] and batch["ids"] == ["a", "c"]
    assert batch["_skipped"] == [("non_finite", "b.wav")]


def test_collate_lays_out_several_captions_per_item_item_major():
    examples = [{"image": torch.zeros(3, 2, 2), "tokens": [np.array([1, 7, 2]), [1, 8, 9, 2]],
                 "references": ("x", "y"), "id": "a"},
                {"image": torch.ones(3, 2, 2), "tokens": [[1, 2], np.array([1, 5, 2])],
                 "references": ("z", "w"), "id": "c"}]
    batch = Collate(modality="image", targets="caption")(examples)
    assert batch["image"].shape == (2, 3, 2, 2)
    assert batch["tokens"].tolist() == [[1, 7, 2, 0], [1, 8, 9, 2], [1, 2, 0, 0], [1, 5, 2, 0]]
    assert batch["token_lengths"].tolist() == [3, 4, 2, 3]


def test_image_label_collate():
    examples = [{"image": torch.zeros(3, 4, 4), "label": 2, "id": "a"},
                {"image": torch.ones(3, 4, 4), "label": 0, "id": "b"}]
    batch = Collate(modality="image", targets="label")(examples)
    assert batch["image"].shape == (2, 3, 4, 4) and batch["label"].tolist() == [2, 0]
    assert batch["label"].dtype == torch.long
    examples[1]["image"] = torch.ones(3, 5, 4)
    with pytest.raises(ValueError, match=r"different sizes .* add a resize and crop"):
        Collate(modality="image", targets="label")(examples)


def test_padding_fraction_by_hand():
    # batch [0,1]: lengths 1, 3 -> 2 of 6 padded; batch [2]: nothing padded -> 2 / 10
    assert padding_fraction([[0, 1], [2]], [1, 3, 4]) == pytest.approx(0.2)
    assert padding_fraction([[(0, 0, 0), (1, 0, 0)]], [2, 2]) == 0.0


# ------------------------------------------------------------------ sampler
LENGTHS = np.random.default_rng(0).uniform(2, 6, size=103)


def _flat(batches):
    return [k for b in batches for k in b]


def test_one_epoch_covers_every_item_once():
    s = BucketBatchSampler(batch_size=8, lengths=LENGTHS, seed=1)
    batches = list(s)
    assert len(batches) == len(s) == 13
    assert sorted(k[0] for k in _flat(batches)) == list(range(103))


def test_order_is_a_function_of_seed_and_epoch():
    a = BucketBatchSampler(batch_size=8, lengths=LENGTHS, seed=1)
    b = BucketBatchSampler(batch_size=8, lengths=LENGTHS, seed=1)
    assert a.batches(0) == b.batches(0)
    assert a.batches(0) != a.batches(1)
    assert a.batches(0) != BucketBatchSampler(batch_size=8, lengths=LENGTHS, seed=2).batches(0)
    a.set_epoch(3)
    epoch3 = list(a)
    assert epoch3 == b.batches(3) and all(k[2] == 3 for k in _flat(epoch3))
    assert list(a) == b.batches(4)        # a new pass after a complete one: the next epoch


def test_bucketing_cuts_padding_at_least_twofold():
    lengths = np.random.default_rng(1).uniform(2, 6, size=3000)  # the synthetic set's spread
    kw = dict(batch_size=32, lengths=lengths, seed=0)
    bucketed = padding_fraction(BucketBatchSampler(**kw).batches(0), lengths)
    plain = padding_fraction(BucketBatchSampler(**kw, bucketing=False).batches(0), lengths)
    assert plain > 0.25 and bucketed < plain / 2


def test_batches_hold_similar_lengths_and_are_shuffled():
    s = BucketBatchSampler(batch_size=8, lengths=LENGTHS, bucket_size=100, seed=0)
    batches = s.batches(0)
    maxima = [max(LENGTHS[k[0]] for k in b) for b in batches]
    assert maxima != sorted(maxima)            # batch order is shuffled...
    for b in batches:                          # ...but each batch is one slice of sorted lengths
        ls = sorted(LENGTHS[k[0]] for k in b)
        inside = ((ls[0] < LENGTHS) & (ls[-1] > LENGTHS)).sum()
        assert inside == len(b) - 2 or len(b) < 3


def test_eval_order_is_sorted_and_fixed():
    s = BucketBatchSampler(batch_size=10, lengths=LENGTHS, shuffle=False)
    flat = [LENGTHS[k[0]] for k in _flat(s.batches(0))]
    assert flat == sorted(flat)
    assert [k[:2] for k in _flat(s.batches(0))] == [k[:2] for k in _flat(s.batches(5))]


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ddp_shards_are_disjoint_and_equal(world, drop_last):
    shards = [BucketBatchSampler(batch_size=8, lengths=LENGTHS, seed=0, drop_last=drop_last,
                                 num_replicas=world, rank=r) for r in range(world)]
    batches = [s.batches(2) for s in shards]
    assert len({len(b) for b in batches}) == 1                       # same number of batches
    assert all(len(b) == len(s) for b, s in zip(batches, shards))
    items = [[k[0] for k in _flat(b)] for b in batches]
    counts = Counter(i for its in items for i in its)
    n_per_rank = len(items[0])
    assert all(len(its) == n_per_rank for its in items)
    if drop_last:  # disjoint; the uneven tail and incomplete batches are dropped
        assert max(counts.values()) == 1 and n_per_rank == (103 // world) // 8 * 8
    else:
        # every item is seen; only the padding up to a multiple of world repeats
        assert set(counts) == set(range(103))
        assert sum(counts.values()) - 103 == (-103) % world


def test_caption_policy_random_draws_one_caption_per_item_per_epoch():
    num_captions = [5] * 50 + [1] * 53
    s = BucketBatchSampler(batch_size=8, lengths=LENGTHS, num_captions=num_captions,
                           caption_policy="random", seed=0)
    e0, e1 = _flat(s.batches(0)), _flat(s.batches(1))
    assert sorted(k[0] for k in e0) == list(range(103))
    assert all(0 <= k[1] < num_captions[k[0]] for k in e0)
    caps0 = {k[0]: k[1] for k in e0}
    caps1 = {k[0]: k[1] for k in e1}
    assert caps0 != caps1 and len({caps0[i] for i in range(50)}) > 1


def test_caption_policy_all_yields_every_pair():
    num_captions = [1 + i % 3 for i in range(103)]
    s = BucketBatchSampler(batch_size=16, lengths=LENGTHS, num_captions=num_captions,
                           caption_policy="all", seed=0)
    pairs = [(k[0], k[1]) for k in _flat(s.batches(0))]
    assert sorted(pairs) == [(i, c) for i in range(103) for c in range(num_captions[i])]
    assert len(s) == -(-sum(num_captions) // 16)


@pytest.mark.parametrize("kw", [dict(), dict(drop_last=True), dict(shuffle=False),
                                dict(bucketing=False), dict(bucket_size=1),
                                dict(num_replicas=3, rank=2), dict(batch_size=200)])
def test_len_matches_iteration(kw):
    s = BucketBatchSampler(**{"batch_size": 7, "lengths": LENGTHS, **kw})
    assert len(s) == len(list(s))
    if kw.get("drop_last"):
        assert all(len(b) == 7 for b in s)


def test_arguments_are_checked():
    with pytest.raises(UserError, match=r"seed \(-1\) must be >= 0; set data.seed"):
        BucketBatchSampler(lengths=[1.0], seed=-1)
    with pytest.raises(UserError, match=r"lengths is empty"):
        BucketBatchSampler(lengths=[])
    with pytest.raises(ValueError, match=r"batch_size \(0\)"):
        BucketBatchSampler(batch_size=0, lengths=[1.0])
    with pytest.raises(ValueError, match=r"caption_policy \('one'\)"):
        BucketBatchSampler(lengths=[1.0], caption_policy="one", num_captions=[1])
    with pytest.raises(ValueError, match="needs num_captions"):
        BucketBatchSampler(lengths=[1.0], caption_policy="all")
    with pytest.raises(ValueError, match=r"rank \(3\)"):
        BucketBatchSampler(lengths=[1.0], num_replicas=2, rank=3).world()


def test_plain_batches_without_bucketing_are_a_fresh_permutation_per_epoch():
    s = BucketBatchSampler(batch_size=8, lengths=LENGTHS, seed=0, bucketing=False)
    e0, e1 = ([k[0] for k in _flat(s.batches(e))] for e in (0, 1))
    assert sorted(e0) == sorted(e1) == list(range(103)) and e0 != e1
    assert all(k[2] == 1 for k in _flat(s.batches(1)))     # keys carry the epoch
    # not sorted by length inside a batch (bucketing would)
    assert any(list(LENGTHS[[k[0] for k in b]]) != sorted(LENGTHS[[k[0] for k in b]])
               for b in s.batches(0))
