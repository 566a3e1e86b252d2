"""The training loader resumes mid-epoch (the sampler's SamplerState in a StatefulDataLoader),
the state's rules around a resume, and no loader draws from the global random generators
(which would shift dropout after a resume)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from mmtf.data import BucketBatchSampler, CaptionDataModule, SamplerState, sample_rng
from mmtf.errors import UserError
from mmtf.text import BPETokenizer
from tests.unit.presets import flat

LENGTHS = np.random.default_rng(0).uniform(2, 6, size=40)


def _dm(root, **kw) -> CaptionDataModule:
    args = dict(format="clotho", root=str(root), batch_size=2, max_seconds=1.0, seed=3)
    dm = flat(CaptionDataModule, **{**args, **kw})
    dm.setup("fit")
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=200))
    return dm


def _fingerprint(batch) -> tuple:
    """What the model sees: ids, the caption tokens and the (randomly cropped, augmented)
    audio, and the mixup pairs and weights."""
    return (tuple(batch["ids"]), tuple(batch["tokens"].flatten().tolist()),
            round(float(batch["audio"].double().sum()), 6), batch["audio"].shape,
            tuple(batch["audio_lengths"].tolist()),
            tuple(batch.get("mix_index", torch.zeros(0)).tolist()),
            tuple(batch.get("mix_lambda", torch.zeros(0)).tolist()))


# data.augment with everything on: speed, noise and gain per item, mixup per batch.
AUGMENT = {"speed": {"p": 0.7}, "noise": {"p": 0.7}, "gain": {"p": 0.7},
           "mixup": {"p": 0.7, "alpha": 0.4}}


@pytest.mark.parametrize("augment", [None, AUGMENT], ids=["plain", "augmented"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_train_loader_resumes_mid_epoch_from_its_state(tiny_audio_captions, num_workers,
                                                       augment):
    """Also with augmentation: its draws come from (seed, epoch, items), so a resumed loader
    and one with workers hand out the same clips, pairs and weights."""
    loader = _dm(tiny_audio_captions, num_workers=num_workers,
                 augment=augment).train_dataloader()
    assert isinstance(loader, StatefulDataLoader) and len(loader) == 3   # 6 clips, batch 2
    loader.batch_sampler.set_epoch(1)
    it = iter(loader)
    first = _fingerprint(next(it))
    state = loader.state_dict()
    rest = [_fingerprint(b) for b in it]
    assert len(rest) == 2

    fresh = _dm(tiny_audio_captions, num_workers=num_workers,
                augment=augment).train_dataloader()
    fresh.load_state_dict(state)
    resumed = [_fingerprint(b) for b in fresh]
    assert resumed == rest and first not in resumed
    if augment:       # the same batches as without workers, and mixed
        serial = _dm(tiny_audio_captions, augment=augment).train_dataloader()
        serial.batch_sampler.set_epoch(1)
        assert [_fingerprint(b) for b in serial] == [first, *rest]
        assert any(lam < 1 for fp in rest for lam in fp[-1])
    # the complete pass moved the sampler to the start of the next epoch
    assert fresh.batch_sampler.state == SamplerState(epoch=2, position=0)


def _roundtrip(obj):
    """``obj`` after torch.save + torch.load(weights_only=True), as in a checkpoint."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _sampler(**kw) -> BucketBatchSampler:
    return BucketBatchSampler(**{"batch_size": 4, "lengths": LENGTHS, "seed": 0, **kw})


def test_a_pass_after_a_complete_one_is_the_next_epoch():
    s = _sampler()
    e0, e1 = list(s), list(s)
    assert e0 == s.batches(0) and e1 == s.batches(1) and e0 != e1
    assert s.state == SamplerState(epoch=1, position=len(s))


def test_a_loaded_position_survives_the_set_epoch_of_a_resume():
    saved = _sampler()
    saved.set_epoch(3)
    it = iter(saved)
    head = [next(it), next(it)]
    state = _roundtrip(saved.state_dict())
    assert (state["epoch"], state["position"]) == (3, 2)
    restored = _sampler()
    restored.load_state_dict(state)
    assert restored.state == SamplerState(epoch=3, position=2, restored=True)
    restored.set_epoch(3)               # what ResumeState does at on_train_start
    assert head + list(restored) == saved.batches(3)
    restored.set_epoch(4)
    assert list(restored) == saved.batches(4)


def test_a_loaded_complete_epoch_continues_with_the_next():
    s = _sampler()
    s.load_state_dict({**s.state_dict(), "epoch": 2, "position": len(s)})
    s.set_epoch(2)                      # the epoch it is in: the position stays
    assert list(s) == s.batches(3)
    assert s.state == SamplerState(epoch=3, position=len(s), restored=False)


def test_a_position_saved_with_other_batching_is_refused():
    state = _sampler(bucket_size=50).state_dict()
    with pytest.raises(UserError, match=r"bucket_size=50 \(now 10\); resume with the same "
                                        r"data settings"):
        _sampler(bucket_size=10).load_state_dict(state)
    with pytest.raises(UserError, match=r"num_examples=40 \(now 39\)"):
        _sampler(lengths=LENGTHS[:39]).load_state_dict(state)
    with pytest.raises(UserError, match=r"batch_size=4 \(now 2\), num_replicas=1 \(now 2\)"):
        _sampler(batch_size=2, num_replicas=2, rank=1).load_state_dict(state)


def test_sample_rng_depends_only_on_seed_epoch_index():
    a = sample_rng(3, 1, 7).standard_normal(4)
    assert np.array_equal(a, np.random.default_rng([3, 1, 7]).standard_normal(4))
    assert not np.array_equal(a, sample_rng(3, 2, 7).standard_normal(4))
    assert not np.array_equal(a, sample_rng(3, 1, 8).standard_normal(4))
    with pytest.raises(ValueError, match=r"epoch \(-1\)"):
        sample_rng(0, -1, 0)


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
