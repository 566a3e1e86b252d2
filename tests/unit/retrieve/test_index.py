"""mmtf.retrieve's pieces without the CLI: the ranking (ties included, hand-worked), the
embedding index file (round trip, what it refuses) and the weights fingerprint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from mmtf.errors import UserError
from mmtf.retrieve import rank
from mmtf.retrieve.index import EmbeddingIndex, weights_fingerprint


def test_rank_orders_by_cosine_and_keeps_the_item_order_among_ties():
    # Items as unit vectors; query q = (1, 0): cosines 0.6, 1.0, 0.6, -1.0, 0.0
    items = torch.tensor([[0.6, 0.8], [1.0, 0.0], [0.6, -0.8], [-1.0, 0.0], [0.0, 1.0]])
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    scores, order = rank(queries, items, top_k=4)
    # q0: 1 (1.0), then the tie 0 and 2 (0.6) in item order, then 4 (0.0)
    assert order[0].tolist() == [1, 0, 2, 4]
    torch.testing.assert_close(scores[0], torch.tensor([1.0, 0.6, 0.6, 0.0]))
    # q1 = (0, 1): cosines 0.8, 0, -0.8, 0, 1.0 -> 4, 0, then the tie 1 and 3 in item order
    assert order[1].tolist() == [4, 0, 1, 3]
    scores, order = rank(queries, items, top_k=10)          # more than there are: all five
    assert order.shape == (2, 5) and scores.shape == (2, 5)


def _index(n: int = 3, e: int = 4) -> EmbeddingIndex:
    emb = torch.nn.functional.normalize(torch.randn(n, e, generator=torch.Generator().manual_seed(0)), dim=-1)
    return EmbeddingIndex(emb, [f"clip{i}.wav" for i in range(n)], "audio", "abc123",
                          "/runs/a.ckpt", "crop")


def test_an_index_round_trips_through_safetensors_with_its_metadata(tmp_path):
    index = _index()
    path = index.save(tmp_path / "sub" / "idx.safetensors")
    with safe_open(str(path), framework="pt") as f:                 # the documented layout
        meta = f.metadata()
        torch.testing.assert_close(f.get_tensor("embeddings"), index.embeddings)
    assert meta["format"] == "mmtf-embedding-index" and meta["modality"] == "audio"
    assert meta["embed_dim"] == "4" and meta["count"] == "3"
    assert json.loads(meta["items"]) == index.items and meta["fingerprint"] == "abc123"
    back = EmbeddingIndex.load(path)
    assert back.items == index.items and back.modality == "audio" and back.embed_dim == 4
    assert (back.fingerprint, back.checkpoint, back.long_audio) == ("abc123", "/runs/a.ckpt",
                                                                    "crop")
    torch.testing.assert_close(back.embeddings, index.embeddings)


def test_an_index_is_refused_when_empty_foreign_narrow_or_not_an_index(tmp_path):
    path = _index().save(tmp_path / "idx.safetensors")
    index = EmbeddingIndex.load(path)
    index.check(path, ckpt_path="a.ckpt", fingerprint="abc123", embed_dim=4)     # fine
    with pytest.raises(UserError, match=r"holds 4-wide embeddings .* ckpt_path=b.ckpt embeds "
                                        r"8-wide ones; rebuild it: .*index_out="):
        index.check(path, ckpt_path="b.ckpt", fingerprint="abc123", embed_dim=8)
    with pytest.raises(UserError, match=r"embedded by another checkpoint \(/runs/a.ckpt, "
                                        r"weights abc123\) than ckpt_path=b.ckpt \(weights "
                                        r"ffff\)"):
        index.check(path, ckpt_path="b.ckpt", fingerprint="ffff", embed_dim=4)
    empty = EmbeddingIndex(torch.zeros(0, 4), [], "audio", "abc123").save(tmp_path / "e.st")
    with pytest.raises(UserError, match=r"no audio items in it \(an empty index\)"):
        EmbeddingIndex.load(empty).check(empty, ckpt_path="a.ckpt", fingerprint="abc123",
                                         embed_dim=4)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UserError, match=r"junk.safetensors is not a safetensors file"):
        EmbeddingIndex.load(tmp_path / "junk.safetensors")
    save_file({"weights": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(UserError, match=r"is not an mmtf embedding index"):
        EmbeddingIndex.load(tmp_path / "other.safetensors")
    with pytest.raises(UserError, match=r"index .*missing.st does not exist"):
        EmbeddingIndex.load(tmp_path / "missing.st")


def test_the_fingerprint_follows_the_weights_not_the_object():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2))
    b = nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2))
    b.load_state_dict(a.state_dict())
    assert weights_fingerprint(a) == weights_fingerprint(b)
    assert len(weights_fingerprint(a)) == 16
    with torch.no_grad():
        b[0].weight[0, 0] += 1e-6
    assert weights_fingerprint(a) != weights_fingerprint(b)
    assert weights_fingerprint(a.to(torch.bfloat16)) != weights_fingerprint(b)   # dtype counts
