"""mmtf.predict.clap's bookkeeping: prediction ids to media (a mixture's ids carry their source's
name), shard members decoded in memory, and what it refuses. The score itself: tests/integration/test_retrieve.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch

import mmtf
from mmtf.data.formats.base import CaptionItem
from mmtf.data.mixture import MixtureDataModule
from mmtf.data.shards import read_shards, write_shards
from mmtf.errors import UserError
from mmtf.predict.clap import clap_model, items_by_id, media_input, score_predictions

from ..tasks.conftest import classifier
from .contrastive_ckpt import save_contrastive_ckpt


def _item(key: str, path: str) -> CaptionItem:
    return CaptionItem(id=key, path=Path(path), captions=("x",), where="test")


def _module(*items: CaptionItem) -> SimpleNamespace:
    return SimpleNamespace(items=lambda split: list(items))


def test_a_mixtures_ids_are_prefixed_with_the_source_name_as_its_rows_are():
    mixture = object.__new__(MixtureDataModule)            # only members() is read
    clotho = SimpleNamespace(name="clotho", module=_module(_item("a", "/c/a.wav")))
    caps = SimpleNamespace(name="audiocaps", module=_module(_item("a", "/ac/a.wav"),
                                                           _item("b", "/ac/b.wav")))
    mixture.members = lambda split: [clotho, caps]
    got = items_by_id(mixture, "test")
    assert {k: str(v.path) for k, v in got.items()} == {
        "clotho/a": "/c/a.wav", "audiocaps/a": "/ac/a.wav", "audiocaps/b": "/ac/b.wav"}
    plain = SimpleNamespace(items=lambda split: [_item("a", "/c/a.wav"), _item("a", "/c/a.wav")])
    assert list(items_by_id(plain, "test")) == ["a"]       # the same file twice is one item
    clash = SimpleNamespace(items=lambda split: [_item("a", "/c/a.wav"), _item("a", "/d/a.wav")])
    with pytest.raises(UserError, match=r"the test id 'a' names two media files \(/c/a.wav, "
                                        r"/d/a.wav\)"):
        items_by_id(clash, "test")


def test_rows_without_media_or_captions_are_refused():
    with pytest.raises(UserError, match=r"no generated captions to score"):
        score_predictions(None, "clap_score", [], {})
    with pytest.raises(UserError, match=r"prediction id 'zz' names no item of the split "
                                        r"\(1 such\)"):
        score_predictions(None, "clap_score", [{"id": "zz", "prediction": "x"}],
                          {"a": _item("a", "/a.wav")})
    with pytest.raises(UserError, match=r"a ClassificationTask checkpoint writes none"):
        clap_model("unused.ckpt", classifier())


def test_a_shard_member_is_decoded_as_its_file_is(tmp_path):
    """A sharded test set has no media files: the member's bytes, decoded at the checkpoint's
    rate, embed as the original file does."""
    rng = np.random.default_rng(0)
    sf.write(tmp_path / "c0.wav", (0.1 * rng.normal(size=12000)).astype(np.float32), 8000,
             subtype="FLOAT")                               # 1.5 s at 8 kHz: resampled
    item = CaptionItem(id="c0", path=tmp_path / "c0.wav", captions=("x",), where="t")
    write_shards([item], tmp_path / "test", prefix="test", shuffle_seed=None)
    (member,) = read_shards(tmp_path, "test", report=lambda error: None,
                            shards={"test": "test/test-000000.tar"})
    model, _ = mmtf.load(save_contrastive_ckpt(tmp_path / "a.ckpt"))
    decoded = media_input(member, model)
    assert isinstance(decoded, torch.Tensor) and decoded.shape == (24000,)   # at 16 kHz
    assert media_input(item, model) == item.path
    torch.testing.assert_close(model.embed_audio([decoded]), model.embed_audio([item.path]),
                               rtol=1e-5, atol=1e-5)
