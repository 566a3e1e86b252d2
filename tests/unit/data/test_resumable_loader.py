"""The training loader resumes mid-epoch (BucketBatchSampler position in a StatefulDataLoader),
and no loader draws from the global random generators (which would shift dropout after a
resume)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from mmtf.data import BucketBatchSampler, CaptionDataModule

LENGTHS = np.random.default_rng(0).uniform(2, 6, size=40)


def _dm(root, **kw) -> CaptionDataModule:
    args = dict(format="clotho", root=str(root), batch_size=2, max_seconds=1.0, seed=3,
                tokenizer={"kind": "bpe", "vocab_size": 200})
    dm = CaptionDataModule(**{**args, **kw})
    dm.setup("fit")
    return dm


def _fingerprint(batch) -> tuple:
    """What the model sees: ids, the caption tokens and the (randomly cropped) audio."""
    return (tuple(batch["ids"]), tuple(batch["tokens"].flatten().tolist()),
            round(float(batch["audio"].double().sum()), 6), batch["audio"].shape)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_train_loader_resumes_mid_epoch_from_its_state(tiny_audio_captions, num_workers):
    loader = _dm(tiny_audio_captions, num_workers=num_workers).train_dataloader()
    assert isinstance(loader, StatefulDataLoader) and len(loader) == 3   # 6 clips, batch 2
    loader.batch_sampler.set_epoch(1)
    it = iter(loader)
    first = _fingerprint(next(it))
    state = loader.state_dict()
    rest = [_fingerprint(b) for b in it]
    assert len(rest) == 2

    fresh = _dm(tiny_audio_captions, num_workers=num_workers).train_dataloader()
    fresh.load_state_dict(state)
    resumed = [_fingerprint(b) for b in fresh]
    assert resumed == rest and first not in resumed
    assert fresh.batch_sampler.epoch == 2        # the complete pass moved it to the next epoch


def test_a_restored_position_survives_lightnings_set_epoch():
    """Lightning sets the epoch on ``batch_sampler.sampler`` at each epoch start (before the
    first fetch). A fresh sampler follows it; a restored one keeps its position (after a
    resume Lightning's epoch counter can be ahead of the restored epoch)."""
    fresh = BucketBatchSampler(batch_size=4, lengths=LENGTHS, seed=0)
    fresh.sampler.set_epoch(3)
    assert fresh.epoch == 3 and list(fresh) == fresh.batches(3)

    saved = BucketBatchSampler(batch_size=4, lengths=LENGTHS, seed=0)
    saved.set_epoch(1)
    it = iter(saved)
    next(it), next(it)
    state = saved.state_dict()
    restored = BucketBatchSampler(batch_size=4, lengths=LENGTHS, seed=0)
    restored.load_state_dict(state)
    restored.sampler.set_epoch(2)
    assert list(restored) == saved.batches(1)[2:]
    assert list(restored) == saved.batches(2)     # then the next epoch, by itself


def test_a_position_saved_with_other_batching_is_refused():
    state = BucketBatchSampler(batch_size=4, lengths=LENGTHS, bucket_size=50).state_dict()
    with pytest.raises(ValueError, match=r"bucket_size=50 \(now 10\); resume with the same "
                                         r"data settings"):
        BucketBatchSampler(batch_size=4, lengths=LENGTHS, bucket_size=10).load_state_dict(state)
    with pytest.raises(ValueError, match=r"num_examples=40 \(now 39\)"):
        BucketBatchSampler(batch_size=4, lengths=LENGTHS[:39]).load_state_dict(state)


def test_loaders_draw_nothing_from_the_global_generators(tiny_audio_captions):
    """Caption choice and crops come from (seed, epoch, item); each loader has its own
    generator for the workers' base seed."""
    dm = _dm(tiny_audio_captions)
    loaders = {split: getattr(dm, f"{split}_dataloader")() for split in ("train", "val")}
    assert all(dl.generator is not None for dl in loaders.values())
    torch.manual_seed(0)
    np.random.seed(0)
    before = torch.get_rng_state(), np.random.get_state()[1].copy()
    for dl in loaders.values():
        for _ in range(2):
            list(dl)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert np.array_equal(np.random.get_state()[1], before[1])
