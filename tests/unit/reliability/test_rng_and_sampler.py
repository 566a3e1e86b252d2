"""RNG state round trip through a weights-only checkpoint; the resumable batch sampler."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from mmtf.reliability import (
    EpochShuffleBatchSampler,
    capture_rng_state,
    make_stateful_dataloader,
    restore_rng_state,
    sample_rng,
)


def draws() -> tuple:
    return (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(),
            np.random.randn(), torch.rand(4).tolist(), torch.randn(2).tolist())


def test_rng_state_survives_a_weights_only_checkpoint(tmp_path):
    random.gauss(0, 1)                  # leaves a cached gaussian in python's generator
    np.random.randn()
    state = capture_rng_state()
    expected = draws()
    path = tmp_path / "rng.pt"
    torch.save({"rng": state}, path)
    loaded = torch.load(path, weights_only=True)["rng"]
    assert draws() != expected          # the generators moved on
    restore_rng_state(loaded)
    assert draws() == expected


def test_restore_rejects_foreign_state():
    with pytest.raises(ValueError, match=r"lacks \['numpy', 'python'\]"):
        restore_rng_state({"torch": torch.get_rng_state()})


def test_sample_rng_depends_only_on_seed_epoch_index():
    a = sample_rng(3, 1, 7).standard_normal(4)
    assert np.array_equal(a, sample_rng(3, 1, 7).standard_normal(4))
    assert not np.array_equal(a, sample_rng(3, 2, 7).standard_normal(4))
    assert not np.array_equal(a, sample_rng(3, 1, 8).standard_normal(4))
    with pytest.raises(ValueError, match=r"epoch \(-1\)"):
        sample_rng(0, -1, 0)


# ---------------------------------------------------------------------------- sampler
def flat(batches) -> list:
    return [i for b in batches for i in b]


def test_each_epoch_is_a_permutation_fixed_by_seed_and_epoch():
    s = EpochShuffleBatchSampler(num_samples=10, batch_size=3, seed=5)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert [len(b) for b in e0] == [3, 3, 3, 1] and len(s) == 4
    assert sorted(flat(e0)) == sorted(flat(e1)) == list(range(10))
    assert flat(e0) != flat(e1)
    g = torch.Generator().manual_seed(5 + 1)      # the documented order: randperm(seed + epoch)
    assert flat(e1) == torch.randperm(10, generator=g).tolist()
    again = EpochShuffleBatchSampler(num_samples=10, batch_size=3, seed=5)
    again.set_epoch(1)
    assert list(again) == e1


def test_a_new_pass_after_a_complete_one_is_the_next_epoch():
    s = EpochShuffleBatchSampler(num_samples=6, batch_size=2, seed=0)
    e0, e1 = list(s), list(s)
    ref = EpochShuffleBatchSampler(num_samples=6, batch_size=2, seed=0)
    ref.set_epoch(1)
    assert e1 == list(ref) and e0 != e1 and s.epoch == 1


def test_mid_epoch_state_continues_exactly():
    s = EpochShuffleBatchSampler(num_samples=11, batch_size=2, seed=1, drop_last=True)
    s.set_epoch(3)
    full = list(s)
    s.set_epoch(4)
    s.set_epoch(3)
    it = iter(s)
    head = [next(it) for _ in range(2)]
    state = s.state_dict()
    assert state["epoch"] == 3 and state["offset"] == 2
    fresh = EpochShuffleBatchSampler(num_samples=11, batch_size=2, seed=1, drop_last=True)
    fresh.load_state_dict(torch.load(_roundtrip(state), weights_only=True))
    fresh.set_epoch(3)                  # what ResumeState does after a resume: keeps position
    assert head + list(fresh) == full


def _roundtrip(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_restored_complete_epoch_then_set_epoch_same_yields_nothing_then_moves_on():
    s = EpochShuffleBatchSampler(num_samples=4, batch_size=2, seed=0)
    done = {**s.state_dict(), "epoch": 2, "offset": 2}
    s.load_state_dict(done)
    s.set_epoch(2)                      # Lightning finishing epoch 2 after a resume
    assert list(s) == []
    s.set_epoch(3)
    ref = EpochShuffleBatchSampler(num_samples=4, batch_size=2, seed=0)
    ref.set_epoch(3)
    epoch3 = list(ref)
    assert list(s) == epoch3
    s.load_state_dict(done)             # ...or Lightning starting epoch 3 on that iterator
    assert list(s) == epoch3


def test_ranks_share_one_permutation():
    shards = [list(EpochShuffleBatchSampler(num_samples=10, batch_size=2, seed=0,
                                            num_replicas=3, rank=r)) for r in range(3)]
    assert [len(s) for s in shards] == [2, 2, 2]                   # ceil(10 / 3) = 4 each
    got = sorted(flat(flat(shards)))
    assert sorted(set(got)) == list(range(10)) and len(got) == 12  # 2 wrap-around pads


def test_state_from_other_settings_is_refused():
    s = EpochShuffleBatchSampler(num_samples=10, batch_size=2)
    other = {**s.state_dict(), "batch_size": 4, "num_replicas": 2}
    with pytest.raises(ValueError, match=r"saved with batch_size=4 \(now 2\), num_replicas=2 "
                                         r"\(now 1\); resume with the same data settings"):
        s.load_state_dict(other)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_samples": 0, "batch_size": 2}, r"num_samples \(0\) must be >= 1"),
    ({"num_samples": 4, "batch_size": 0}, r"batch_size \(0\) must be >= 1"),
    ({"num_samples": 4, "batch_size": 2, "num_replicas": 2, "rank": 2},
     r"rank \(2\) must be in \[0, num_replicas=2\)"),
])
def test_sampler_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EpochShuffleBatchSampler(**kwargs)


class Squares(Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, key):
        epoch, i = key
        return torch.tensor([i, epoch, int(sample_rng(0, epoch, i).integers(1000))])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_mid_epoch(num_workers):
    def loader():
        s = EpochShuffleBatchSampler(num_samples=20, batch_size=3, seed=2, yield_epoch=True)
        return make_stateful_dataloader(Squares(), s, num_workers=num_workers, seed=0)

    dl = loader()
    dl.batch_sampler.set_epoch(1)
    full = [b.tolist() for b in dl]
    dl = loader()
    dl.batch_sampler.set_epoch(1)
    it = iter(dl)
    head = [next(it).tolist() for _ in range(3)]
    state = torch.load(_roundtrip(dl.state_dict()), weights_only=True)
    del it, dl
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == full
    assert all(row[1] == 1 for b in full for row in b)      # epoch reached the dataset


def test_loader_needs_a_stateful_batch_sampler():
    with pytest.raises(ValueError, match=r"batch_sampler BatchSampler has no state_dict\(\)"):
        make_stateful_dataloader(Squares(), torch.utils.data.BatchSampler(range(20), 2, False))


class ByLength(EpochShuffleBatchSampler):
    """A bucketing sampler in the shape the data pipeline needs: only the batches change."""

    def __init__(self, *, lengths: list[int], batch_size: int, seed: int = 0) -> None:
        super().__init__(num_samples=len(lengths), batch_size=batch_size, seed=seed)
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths) // self.batch_size

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        order = sorted(range(len(self.lengths)), key=lambda i: self.lengths[i])   # buckets
        batches = [order[i:i + self.batch_size] for i in range(0, len(self) * self.batch_size,
                                                                self.batch_size)]
        g = torch.Generator().manual_seed(self.seed + epoch)
        return [batches[j] for j in torch.randperm(len(batches), generator=g).tolist()]


def test_a_subclass_with_its_own_batches_resumes_mid_epoch():
    lengths = [5, 1, 9, 3, 7, 2, 8, 4, 6]
    s = ByLength(lengths=lengths, batch_size=2, seed=4)
    s.set_epoch(2)
    full = list(s)
    assert len(full) == 4 and all(abs(lengths[a] - lengths[b]) == 1 for a, b in full)
    s.set_epoch(0)
    s.set_epoch(2)
    it = iter(s)
    head = [next(it)]
    resumed = ByLength(lengths=lengths, batch_size=2, seed=4)
    resumed.load_state_dict(s.state_dict())
    assert head + list(resumed) == full
