"""Batches cut by a padded-size budget (``data.batches.max_seconds_per_batch`` / ``max_pixels_per_batch``):
the budget holds, every example comes once per epoch, every rank and every epoch has the same
number of batches (``__len__``), a resumed sampler or loader hands out the rest of the epoch,
and the data module's keys are checked. Each against a reference computed here by hand."""

from __future__ import annotations

import io
import logging
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from mmtf.data import BucketBatchSampler, CaptionDataModule, ClassificationDataModule
from mmtf.data.image import build_transform, header_sizes, transformed_pixels
from mmtf.errors import ConfigError, UserError
from mmtf.text import BPETokenizer
from tests.unit.presets import flat

RNG = np.random.default_rng(0)
LENGTHS = RNG.uniform(1.0, 30.0, size=300)       # seconds
CAPTIONS = RNG.integers(1, 6, size=300)
BUDGET = 120.0


def _sampler(**kw) -> BucketBatchSampler:
    args = dict(lengths=LENGTHS, batch_size=None, budget=BUDGET, bucket_size=8, seed=1)
    return BucketBatchSampler(**{**args, **kw})


def _padded(batch, lengths=LENGTHS) -> float:
    ls = [lengths[k[0]] for k in batch]
    return len(ls) * max(ls)


def _examples(batches) -> Counter:
    return Counter((k[0], k[1]) for b in batches for k in b)


# ---------------------------------------------------------------------------- the budget
@pytest.mark.parametrize("bucketing", [True, False])
def test_no_batch_is_over_the_budget_but_an_item_longer_than_it_alone(bucketing):
    lengths = LENGTHS.copy()
    lengths[[3, 50, 77]] = [150.0, 121.0, 400.0]         # each over the budget by itself
    s = _sampler(lengths=lengths, bucketing=bucketing)
    for epoch in range(4):
        batches = s.batches(epoch)
        for b in batches:
            assert _padded(b, lengths) <= BUDGET or (len(b) == 1 and lengths[b[0][0]] > BUDGET)
        alone = sorted(b[0][0] for b in batches if len(b) == 1 and lengths[b[0][0]] > BUDGET)
        assert alone == [3, 50, 77]


def test_batches_fill_the_budget():
    """Sorted pools fill most of the budget: at most 10% more batches than the fewest possible
    (every example sorted once by length and cut greedily), and >= 85% of padded size used."""
    s = _sampler(bucket_size=20)
    fewest, size, longest = 1, 0, 0.0
    for length in np.sort(LENGTHS)[::-1]:    # longest first: each batch takes what fits
        if size and (size + 1) * longest > BUDGET:
            fewest, size = fewest + 1, 0
        if size == 0:
            longest = length
        size += 1
    batches = s.batches(0)
    assert fewest <= len(batches) <= 1.1 * fewest
    assert sum(_padded(b) for b in batches) / (len(batches) * BUDGET) >= 0.85
    # and batch sizes follow the lengths: short clips come many to a batch
    sizes = {len(b): np.mean([LENGTHS[k[0]] for k in b]) for b in batches}
    assert max(sizes) >= 10 and sizes[max(sizes)] < sizes[min(sizes)]


# ---------------------------------------------------------------------------- each example once
@pytest.mark.parametrize("policy", ["first", "random", "all"])
def test_every_example_exactly_once_per_epoch(policy):
    s = _sampler(caption_policy=policy, num_captions=CAPTIONS)
    if policy == "all":
        expected = Counter((i, c) for i in range(300) for c in range(CAPTIONS[i]))
    for epoch in range(3):
        seen = _examples(s.batches(epoch))
        if policy == "all":
            assert seen == expected
        else:
            assert sorted(i for i, _ in seen) == list(range(300)) and max(seen.values()) == 1
            assert all(0 <= c < CAPTIONS[i] for i, c in seen)
            assert (policy == "first") == all(c == 0 for _, c in seen)


# ---------------------------------------------------------------------------- DDP and __len__
@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_has_the_same_number_of_batches_every_epoch(world):
    ranks = [_sampler(num_replicas=world, rank=r) for r in range(world)]
    counts = {len(s) for s in ranks}
    assert len(counts) == 1
    for epoch in range(5):
        per_rank = [s.batches(epoch) for s in ranks]
        assert [len(b) for b in per_rank] == [len(ranks[0])] * world
        seen = Counter(k[0] for bs in per_rank for b in bs for k in b)
        # all items; the uneven tail (300 % 3 == 0, so none here) would repeat the first ones
        assert sorted(seen) == list(range(300)) and set(seen.values()) == {1}
        assert all(_padded(b) <= BUDGET for bs in per_rank for b in bs)
        # disjoint: no item on two ranks
        sets = [{k[0] for b in bs for k in b} for bs in per_rank]
        assert sum(map(len, sets)) == 300


@pytest.mark.parametrize("kw", [{}, {"shuffle": False}, {"bucketing": False},
                                {"num_replicas": 2, "rank": 1}, {"drop_last": True,
                                                                 "num_replicas": 7, "rank": 3}])
def test_len_is_the_count_of_every_epoch(kw):
    s = _sampler(**kw)
    assert [len(s.batches(e)) for e in range(6)] == [len(s)] * 6
    assert len(list(s)) == len(s)          # and what iterating hands out


class _ShiftingEpochs(BucketBatchSampler):
    """A sampler whose epochs hold other lengths (as a mixture's draws do): epoch 0 the short
    half of the items twice, later epochs the long half twice."""

    def rank_examples(self, epoch, rank=None):
        order = np.argsort(self.lengths, kind="stable")
        half = order[:len(order) // 2] if epoch == 0 else order[len(order) // 2:]
        items = np.concatenate([half, half])
        return items, np.zeros(len(items), dtype=np.int64)


def test_an_epoch_that_needs_more_batches_keeps_the_count_and_says_so(caplog):
    s = _ShiftingEpochs(lengths=LENGTHS, batch_size=None, budget=BUDGET, bucket_size=4, seed=0)
    short = s.batches(0)
    assert len(short) == len(s) and all(_padded(b) <= BUDGET for b in short)
    with caplog.at_level(logging.WARNING, logger="mmtf.data"):
        long = s.batches(1)
    assert len(long) == len(s)
    assert _examples(long) == Counter({(int(i), 0): 2 for i in np.argsort(LENGTHS)[150:]})
    assert "need more than the" in caplog.text and "Raise the budget" in caplog.text


def test_a_count_that_changes_by_little_is_met_by_bigger_pools_not_by_merging(caplog):
    """Epochs of one data set cut a batch or two more or fewer than epoch 0; the bigger pools
    (not the over-budget merge) absorb it."""
    s = _sampler(bucket_size=2)
    raw = [len(s._cut(*s.rank_examples(e), e)) for e in range(12)]
    assert max(raw) > len(s)                # some epoch cuts more than epoch 0 ...
    with caplog.at_level(logging.WARNING, logger="mmtf.data"):
        for e in range(12):
            assert all(_padded(b) <= BUDGET for b in s.batches(e))
    assert caplog.text == ""                # ... and fits within the budget all the same


# ---------------------------------------------------------------------------- resume
def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_a_sampler_resumed_mid_epoch_hands_out_the_same_remaining_batches():
    saved = _sampler(num_replicas=2, rank=1)
    saved.set_epoch(2)
    it = iter(saved)
    head = [next(it) for _ in range(5)]
    state = _roundtrip(saved.state_dict())
    assert state["budget"] == BUDGET and state["batch_size"] is None
    restored = _sampler(num_replicas=2, rank=1)
    restored.load_state_dict(state)
    restored.set_epoch(2)
    assert head + list(restored) == saved.batches(2)
    assert list(restored) == saved.batches(3)


def test_a_position_saved_under_another_budget_or_a_batch_size_is_refused():
    state = _sampler().state_dict()
    with pytest.raises(UserError, match=r"budget=120.0 \(now 90.0\).*max_seconds_per_batch"):
        _sampler(budget=90.0).load_state_dict(state)
    with pytest.raises(UserError, match=r"batch_size=None \(now 8\), budget=120.0 \(now None\)"):
        _sampler(budget=None, batch_size=8).load_state_dict(state)


def test_sampler_arguments_are_checked():
    with pytest.raises(UserError, match=r"batch_size \(8\) and budget \(10\) are both set"):
        BucketBatchSampler(lengths=LENGTHS, batch_size=8, budget=10)
    for bad in (0, -1.0, float("inf"), True):
        with pytest.raises(UserError, match=r"budget \(.*\) must be a positive number"):
            BucketBatchSampler(lengths=LENGTHS, batch_size=None, budget=bad)
    with pytest.raises(UserError, match=r"lengths must be finite and >= 0"):
        BucketBatchSampler(lengths=[1.0, float("nan")], batch_size=None, budget=10)


# ---------------------------------------------------------------------------- the data module
def _dm(root, **kw) -> CaptionDataModule:
    args = dict(format="clotho", root=str(root), batch_size=None, max_seconds_per_batch=3.2,
                seed=3, bucket_size=2)
    dm = flat(CaptionDataModule, **{**args, **kw})
    dm.setup("fit")
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=200))
    return dm


def _fingerprint(batch) -> tuple:
    return (tuple(batch["ids"]), tuple(batch["tokens"].flatten().tolist()),
            round(float(batch["audio"].double().sum()), 6), tuple(batch["audio"].shape),
            tuple(batch.get("mix_index", torch.zeros(0)).tolist()),
            tuple(batch.get("mix_lambda", torch.zeros(0)).tolist()))


MIXUP = {"mixup": {"p": 1.0, "alpha": 0.4}}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_train_loader_with_several_captions_and_mixup_resumes_mid_epoch(
        tiny_audio_captions, num_workers):
    """6 clips of 1-2 s, max_seconds 1.5 (random crops), 3.2 s per batch: 2 clips a batch; 2
    captions per item and mixup on every pair, on batches whose size the budget sets."""
    kw = dict(max_seconds=1.5, captions_per_item=2, augment=MIXUP, num_workers=num_workers)
    loader = _dm(tiny_audio_captions, **kw).train_dataloader()
    assert len(loader) == 3
    loader.batch_sampler.set_epoch(1)
    batches = list(loader)
    assert len(batches) == 3 and sorted(i for b in batches for i in b["ids"]) == \
        sorted(item.id for item in loader.dataset.items)
    for b in batches:
        n = len(b["ids"])
        assert n * b["audio"].shape[1] <= 3.2 * 16000               # padded samples
        assert b["tokens"].shape[0] == 2 * n                         # 2 captions per item
        assert sorted(b["mix_index"].tolist()) == list(range(n))     # pairs within the batch
    assert any(lam < 1 for b in batches for lam in b["mix_lambda"].tolist())

    loader = _dm(tiny_audio_captions, **kw).train_dataloader()
    loader.batch_sampler.set_epoch(1)
    it = iter(loader)
    first = _fingerprint(next(it))
    state = loader.state_dict()
    fresh = _dm(tiny_audio_captions, **kw).train_dataloader()
    fresh.load_state_dict(state)
    assert [first, *map(_fingerprint, fresh)] == [_fingerprint(b) for b in batches]


def test_val_takes_its_own_budget_else_eval_batch_size_else_the_training_rule(
        tiny_audio_captions):
    durations = _dm(tiny_audio_captions).durations("val")            # full clips in val
    val = _dm(tiny_audio_captions, eval_max_seconds_per_batch=100.0).batch_sampler("val")
    assert (val.batch_size, val.budget, len(val)) == (None, 100.0, 1)
    val = _dm(tiny_audio_captions, eval_batch_size=2).batch_sampler("val")
    assert (val.batch_size, val.budget) == (2, None)
    val = _dm(tiny_audio_captions, max_seconds_per_batch=2 * max(durations)).batch_sampler("val")
    assert val.budget == 2 * max(durations) and all(_padded(b, durations) <= val.budget
                                                    for b in val.batches(0))
    dm = _dm(tiny_audio_captions)
    dm.batch_size = 1                    # what mmtf.evaluate's batch_size does: it rules val
    assert (dm.batch_sampler("val").batch_size, dm.batch_sampler("val").budget) == (1, None)
    assert dm.batch_sampler("train").budget == 3.2


def test_items_over_the_budget_are_named_in_a_warning(tiny_audio_captions, caplog):
    with caplog.at_level(logging.WARNING, logger="mmtf.data"):
        s = _dm(tiny_audio_captions, max_seconds_per_batch=1.2).batch_sampler("train")
    over = sum(d > 1.2 for d in s.lengths)
    assert over and f"{over} item(s) are longer than the budget of 1.2 seconds" in caplog.text


@pytest.mark.parametrize("kw, match", [
    ({"batch_size": 8}, r"data.batches.batch_size \(8\) and data.batches.max_seconds_per_batch \(3.2\): "
                        r"exactly one.*set data.batches.batch_size=null"),
    ({"max_seconds_per_batch": None}, r"data.batches.batch_size \(None\).*set data.batches.batch_size or "
                                      r"data.batches.max_seconds_per_batch"),
    ({"max_pixels_per_batch": 4096}, r"data.batches.max_pixels_per_batch \(4096\) is for images; this "
                                     r"data is audio: use data.batches.max_seconds_per_batch"),
    ({"eval_max_seconds_per_batch": 0}, r"data.batches.eval_max_seconds_per_batch \(0\) must be a "
                                        r"positive number of seconds"),
    ({"eval_max_seconds_per_batch": 5, "eval_batch_size": 2}, r"data.batches.eval_batch_size \(2\) and "
                                                              r"data.batches.eval_max_seconds_per_batch"),
])
def test_data_module_keys_are_checked(tiny_audio_captions, kw, match):
    args = dict(format="clotho", root=str(tiny_audio_captions), batch_size=None,
                max_seconds_per_batch=3.2)
    with pytest.raises(ConfigError, match=match):
        flat(CaptionDataModule, **{**args, **kw})


# ---------------------------------------------------------------------------- images: pixels
def test_pixels_are_counted_after_the_transforms_from_the_header(tmp_path):
    paths = []
    for i, (w, h) in enumerate([(40, 30), (64, 64), (40, 30), (20, 90)]):
        paths.append(tmp_path / f"{i}.png")
        Image.new("RGB", (w, h)).save(paths[-1])
    assert transformed_pixels(header_sizes(paths), None) == [1200, 4096, 1200, 1800]
    resize = build_transform([{"_target_": "torchvision.transforms.v2.Resize", "size": 16}])
    assert transformed_pixels(header_sizes(paths), resize) == [21 * 16, 16 * 16, 21 * 16, 16 * 72]
    crop = build_transform([{"_target_": "torchvision.transforms.v2.RandomResizedCrop",
                             "size": [8, 12]}])
    assert transformed_pixels(header_sizes(paths), crop) == [96] * 4


def test_images_batch_by_pixels(tiny_image_captions, tiny_image_labels):
    """32x32 images (1024 pixels), 3000 pixels a batch: 2 images a batch."""
    dm = flat(CaptionDataModule, format="coco", root=str(tiny_image_captions), batch_size=None,
                           max_pixels_per_batch=3000, seed=0)
    dm.setup("fit")
    s = dm.batch_sampler("train")
    assert set(s.lengths) == {1024.0} and len(s) == 3
    assert [len(b) for b in s.batches(0)] == [2, 2, 2]
    labels = flat(ClassificationDataModule, format="image_folder", root=str(tiny_image_labels),
                                      batch_size=None, max_pixels_per_batch=4096,
                                      eval_max_pixels_per_batch=8192)
    labels.setup("fit")
    assert [len(b) for b in labels.batch_sampler("train").batches(0)] == [4, 4]
    assert len(labels.batch_sampler("val")) == 1
    with pytest.raises(ConfigError, match=r"data.batches.max_seconds_per_batch \(10\) is for audio"):
        flat(CaptionDataModule, format="coco", root=str(tiny_image_captions), batch_size=None,
                          max_seconds_per_batch=10)
