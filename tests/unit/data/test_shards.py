"""Tar shards (mmtf.data.shards: index, reader, writer): brace patterns, the writer's
round trip of every built-in caption layout, indexes (sidecar, cache, foreign shards), the
stream sampler (disjoint and covering over ranks x workers, resumable), fsspec URLs, bad input.

References are independent of the code under test: the source data module's own items and
decoded media, and sets of item indices."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections import Counter, OrderedDict
from pathlib import Path

import fsspec
import fsspec.implementations.memory
import fsspec.spec
import numpy as np
import pytest
import torch
from hydra.utils import get_class
from PIL import Image
from torch.utils.data import DataLoader, Dataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from mmtf.data import CaptionDataModule, DataError
from mmtf.data.errors import ErrorPolicy
from mmtf.data.shards import index as shards_index
from mmtf.data.shards import reader as shards_reader
from mmtf.data.shards.index import INDEX_SUFFIX, expand_braces, load_index, read_shards
from mmtf.data.shards.reader import (
    ShardDataModule,
    ShardStreamSampler,
    bucket_buffer,
    shuffle_buffer,
)
from mmtf.data.shards.writer import write_shards
from mmtf.errors import ConfigError, UserError
from mmtf.text import BPETokenizer, CharTokenizer
from tests.counting_fs import CountingMemory
from tests.unit.data.conftest import sine, write_audio
from tests.unit.presets import flat

SPLITS = ("train", "val", "test")


# ---------------------------------------------------------------------------- helpers
def _shard_all(src: CaptionDataModule, out: Path, shard_size: int = 2) -> None:
    for split in SPLITS:
        write_shards(src.items(split), out / split, prefix=split, shard_size=shard_size)


def _shard_dm(root: Path, modality: str = "audio", **kw) -> ShardDataModule:
    shards = {s: f"{s}/*.tar" for s in SPLITS}
    return flat(ShardDataModule, root=str(root), shards=kw.pop("shards", shards), modality=modality,
                           **kw)


def _media(dm: CaptionDataModule, split: str) -> dict[str, torch.Tensor]:
    if dm.tokenizer is None:
        dm.connect(CharTokenizer.train(dm.train_captions()))
    ds = dm._dataset(split, "full")
    return {it.id: ds.load(i) for i, it in enumerate(ds.items)}


def _assert_round_trip(src: CaptionDataModule, dm: CaptionDataModule) -> None:
    """Same items, same captions (and speech language/task), same durations, same decoded
    media, split by split."""
    for split in SPLITS:
        a = {it.id: (it, d) for it, d in zip(src.items(split), src.durations(split))}
        b = {it.id: (it, d) for it, d in zip(dm.items(split), dm.durations(split))}
        assert a.keys() == b.keys() and a, split
        for k in a:
            assert a[k][0].captions == b[k][0].captions, k
            assert (a[k][0].language, a[k][0].task) == (b[k][0].language, b[k][0].task), k
            assert a[k][1] == pytest.approx(b[k][1]), k
        ma, mb = _media(src, split), _media(dm, split)
        for k in ma:
            assert torch.equal(ma[k], mb[k]), k


def _tar(path: Path, members: dict[str, bytes], gz: bool = False) -> Path:
    """A shard written by "someone else": plain tarfile, no index."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _flac(seconds: float = 0.5, hz: float = 440.0) -> bytes:
    buf = io.BytesIO()
    import soundfile as sf

    sf.write(buf, sine(seconds, 16000, hz), 16000, format="FLAC")
    return buf.getvalue()


def _png_bytes(color=(255, 0, 0), size=(8, 6)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


# ---------------------------------------------------------------------------- the package
def test_the_package_names_resolve_to_their_modules_and_old_targets_still_load():
    """Stored configs name ``mmtf.data.shards.ShardDataModule``: it is the reader's class; every
    exported name loads from its module; a wrong one is an AttributeError, not an ImportError."""
    import mmtf.data.shards as pkg
    from mmtf.data.shards import index, reader, writer

    assert get_class("mmtf.data.shards.ShardDataModule") is reader.ShardDataModule
    for name in pkg.__all__:
        assert any(getattr(m, name, None) is getattr(pkg, name) for m in (index, reader, writer))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pkg.nope  # noqa: B018


# ---------------------------------------------------------------------------- shard lists
def test_brace_patterns_expand_like_webdataset():
    assert expand_braces("a/{000..002}.tar") == ["a/000.tar", "a/001.tar", "a/002.tar"]
    assert expand_braces("{8..10}.tar") == ["8.tar", "9.tar", "10.tar"]
    assert expand_braces("s3://b/{x,y}-{0..1}.tar") == [
        "s3://b/x-0.tar", "s3://b/x-1.tar", "s3://b/y-0.tar", "s3://b/y-1.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(ConfigError, match=r"range \{5\.\.2\} .* runs backwards; write \{2\.\.5\}"):
        expand_braces("{5..2}.tar")


# ---------------------------------------------------------------------------- writer round trip
def test_writer_round_trips_the_builtin_audio_set(tiny_audio_captions, tmp_path):
    src = flat(CaptionDataModule, format="clotho", root=str(tiny_audio_captions))
    _shard_all(src, tmp_path)
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == [
        "train-000000.tar", f"train-000000.tar{INDEX_SUFFIX}", "train-000001.tar",
        f"train-000001.tar{INDEX_SUFFIX}", "train-000002.tar", f"train-000002.tar{INDEX_SUFFIX}"]
    _assert_round_trip(src, _shard_dm(tmp_path))


def test_writer_round_trips_the_builtin_image_set(tiny_image_captions, tmp_path):
    src = flat(CaptionDataModule, format="coco", root=str(tiny_image_captions),
                            splits={"train": "train", "val": "val", "test": "test"})
    _shard_all(src, tmp_path, shard_size=4)
    _assert_round_trip(src, _shard_dm(tmp_path, modality="image"))


def test_writer_round_trips_audiocaps_and_manifest_layouts(tmp_path):
    """AudioCaps (several rows per clip), an audio manifest with speech language/task and
    odd ids (dots, slashes: not WebDataset keys), an image manifest."""
    ac = tmp_path / "audiocaps"
    for split in SPLITS:
        rows = []
        for k in range(3):
            write_audio(ac / "audio" / split / f"yt{k}.wav", sine(0.2 + 0.1 * k, 16000, 300 + k))
            rows += [f"{k}1,yt{k},0,{split} clip {k} first", f"{k}2,yt{k},0,{split} clip {k} two"]
        (ac / f"{split}.csv").write_text("audiocap_id,youtube_id,start_time,caption\n"
                                         + "\n".join(rows) + "\n")
    src = flat(CaptionDataModule, format="audiocaps", root=str(ac))
    _shard_all(src, tmp_path / "ac_shards")
    _assert_round_trip(src, _shard_dm(tmp_path / "ac_shards"))

    man = tmp_path / "manifest"
    for split in SPLITS:
        lines = []
        for k in range(3):
            write_audio(man / "clips" / f"{split}.{k}.flac", sine(0.3, 8000, 200 + 50 * k), 8000)
            line = {"audio": f"clips/{split}.{k}.flac", "text": f"words {k}",
                    "id": f"spk/{split}.{k}"}
            if k == 1:
                line.update(language="de", task="translate")
            lines.append(json.dumps(line))
        (man / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    src = flat(CaptionDataModule, format="manifest", modality="audio", root=str(man))
    _shard_all(src, tmp_path / "man_shards")
    _assert_round_trip(src, _shard_dm(tmp_path / "man_shards"))

    img = tmp_path / "images"
    for split in SPLITS:
        lines = []
        for k in range(3):
            path = img / "img" / f"{split}{k}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_png_bytes((40 * k, 0, 200)))
            lines.append(json.dumps({"image": f"img/{split}{k}.png", "caption": [f"c{k}", "d"]}))
        (img / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    src = flat(CaptionDataModule, format="manifest", modality="image", root=str(img))
    _shard_all(src, tmp_path / "img_shards")
    _assert_round_trip(src, _shard_dm(tmp_path / "img_shards", modality="image"))


def test_writer_limits_shards_by_bytes_and_rewrites_cleanly(tiny_audio_captions, tmp_path):
    src = flat(CaptionDataModule, format="clotho", root=str(tiny_audio_captions))
    items = src.items("train")
    biggest = max(Path(it.path).stat().st_size for it in items)
    paths = write_shards(items, tmp_path, prefix="train", shard_size=100,
                         shard_bytes=2 * biggest + 8 * 512)
    assert 3 <= len(paths) <= 6
    assert all(p.stat().st_size <= 2 * biggest + 10 * 512 for p in paths)
    again = write_shards(items, tmp_path, prefix="train", shard_size=100)
    assert [p.name for p in again] == ["train-000000.tar"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train-000000.tar",
                                                          f"train-000000.tar{INDEX_SUFFIX}"]


# ---------------------------------------------------------------------------- indexes
def test_a_foreign_shard_is_scanned_once_and_its_index_cached(tmp_path, monkeypatch):
    """WebDataset's conventions: the key ends at the first dot; .json caption/captions or .txt;
    keys in sub-folders. The index is written beside the shard, then read from there; a
    read-only folder caches it under index_cache."""
    members = {"a.flac": _flac(0.5), "a.json": json.dumps({"caption": "one dog"}).encode(),
               "d/b.flac": _flac(0.25), "d/b.txt": b"two cats\n",
               "c.seg.flac": _flac(0.75), "c.json": json.dumps({"captions": ["x", "y"]}).encode()}
    shard = _tar(tmp_path / "own" / "s.tar", members)
    index, how = load_index(str(shard), cache_dir=tmp_path / "cache")
    assert how == "scanned" and (tmp_path / "own" / f"s.tar{INDEX_SUFFIX}").is_file()
    assert load_index(str(shard), cache_dir=tmp_path / "cache")[1] == "sidecar"
    items = read_shards(tmp_path, "train", report=ErrorPolicy("raise"),
                        shards={"train": "own/s.tar"})
    assert [(i.id, i.captions, round(i.duration, 3)) for i in items] == [
        ("a", ("one dog",), 0.5), ("d/b", ("two cats",), 0.25), ("c", ("x", "y"), 0.75)]

    ro = tmp_path / "ro"                     # a folder the index cannot be written to
    _tar(ro / "s.tar", members)
    real = shards_index._write_json

    def refuse(path, obj):
        if Path(path).parent == ro:
            raise PermissionError(13, "Permission denied", str(path))
        real(path, obj)

    monkeypatch.setattr(shards_index, "_write_json", refuse)
    assert load_index(str(ro / "s.tar"), cache_dir=tmp_path / "cache")[1] == "scanned"
    assert load_index(str(ro / "s.tar"), cache_dir=tmp_path / "cache")[1] == "cache"
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1 and len(list(ro.iterdir())) == 1


def test_a_rewritten_shard_is_indexed_again(tmp_path):
    shard = _tar(tmp_path / "s.tar", {"a.flac": _flac(), "a.txt": b"x"})
    load_index(str(shard))
    _tar(shard, {"a.flac": _flac(), "a.txt": b"x", "b.flac": _flac(), "b.txt": b"y"})
    index, how = load_index(str(shard))
    assert how == "scanned" and [s["key"] for s in index["samples"]] == ["a", "b"]


def test_shards_through_an_fsspec_url(tiny_audio_captions, tmp_path):
    """memory:// (any fsspec file system): the writer's shards uploaded with their indexes,
    read by URL; a foreign shard there gets its index in index_cache."""
    src = flat(CaptionDataModule, format="clotho", root=str(tiny_audio_captions))
    _shard_all(src, tmp_path / "local")
    fs = fsspec.filesystem("memory")
    for p in (tmp_path / "local").rglob("*"):
        if p.is_file():
            fs.pipe(f"/mmtf-test/{p.relative_to(tmp_path / 'local')}", p.read_bytes())
    try:
        shards = {s: f"memory://mmtf-test/{s}/{s}-{{000000..000001}}.tar" for s in SPLITS}
        shards["train"] = "memory://mmtf-test/train/*.tar"
        dm = _shard_dm(tmp_path, shards=shards, index_cache=str(tmp_path / "cache"))
        assert dm.items("train")[0].shard.startswith("memory://")
        assert "/mmtf-test/train/train-00000" in dm.items("train")[0].shard
        _assert_round_trip(src, dm)
        fs.rm(f"/mmtf-test/val/val-000000.tar{INDEX_SUFFIX}")
        assert load_index("memory://mmtf-test/val/val-000000.tar",
                          cache_dir=tmp_path / "cache")[1] == "scanned"
        assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    finally:
        fs.rm("/mmtf-test", recursive=True)


# ---------------------------------------------------------------------------- bad input
def test_a_missing_shard_is_one_error_or_skipped_and_counted(tmp_path):
    _tar(tmp_path / "s-0.tar", {"a.flac": _flac(), "a.txt": b"x"})
    shards = {"train": "s-{0..1}.tar"}
    with pytest.raises(DataError, match=r"s-1\.tar: shard not found; check data\.shards and "
                                        r"data\.root \(or set data\.on_error=skip"):
        read_shards(tmp_path, "train", report=ErrorPolicy("raise"), shards=shards)
    policy = ErrorPolicy("skip")
    assert len(read_shards(tmp_path, "train", report=policy, shards=shards)) == 1
    assert policy.counter["missing_file"] == 1
    with pytest.raises(DataError, match=r"no shard matches the pattern of split 'val'"):
        read_shards(tmp_path, "val", report=policy, shards={"val": "nope/*.tar"})
    with pytest.raises(DataError, match=r"data\.shards has no shards for split 'test'; set "
                                        r"data\.shards\.test="):
        read_shards(tmp_path, "test", report=policy, shards=shards)
    with pytest.raises(ConfigError, match=r"needs data\.shards .* use data=shards"):
        flat(CaptionDataModule, format="shards", modality="audio", root=str(tmp_path)).items("train")


def test_bad_samples_are_named_by_shard_and_key(tmp_path):
    """No caption, an undecodable member, an empty caption, an image in an audio set, bad JSON:
    each one DataError naming shard and key, or skipped and counted under its reason."""
    _tar(tmp_path / "bad.tar", {
        "ok.flac": _flac(), "ok.txt": b"fine",
        "nocap.flac": _flac(),
        "noise.flac": os.urandom(3000), "noise.txt": b"static",
        "blank.flac": _flac(), "blank.json": json.dumps({"captions": ["  ", "kept"]}).encode(),
        "pic.png": _png_bytes(), "pic.txt": b"an image",
        "broken.flac": _flac(), "broken.json": b"{not json",
    })
    shards = {"train": "bad.tar"}
    with pytest.raises(DataError, match=r"bad\.tar \(key nocap\): sample nocap it has no "
                                        r"caption") as err:
        read_shards(tmp_path, "train", report=ErrorPolicy("raise"), shards=shards)
    assert err.value.reason == "bad_row"
    policy = ErrorPolicy("skip")
    items = read_shards(tmp_path, "train", report=policy, shards=shards)
    assert [(i.id, i.captions) for i in items] == [("ok", ("fine",)), ("blank", ("kept",))]
    assert policy.counter.as_dict() == {"bad_row": 3, "undecodable": 1, "empty_caption": 1}
    where = " ".join(w for ws in policy.counter.examples.values() for w in ws)
    for key in ("nocap", "noise", "pic", "broken", "blank"):
        assert f"bad.tar (key {key})" in where or f"key {key}" in where, (key, where)
    with pytest.raises(DataError, match=r"key pic\): sample pic has no audio member \(it has an "
                                        r"image member: set data.modality=image\)"):
        read_shards(tmp_path, "train", report=ErrorPolicy("raise"),
                    shards={"train": _tar(tmp_path / "p.tar", {"pic.png": _png_bytes(),
                                                               "pic.txt": b"x"}).name})


def test_a_compressed_or_broken_tar_is_refused_whole(tmp_path):
    _tar(tmp_path / "z.tar.gz", {"a.flac": _flac(), "a.txt": b"x"}, gz=True)
    with pytest.raises(DataError, match=r"z\.tar\.gz: is a compressed tar; .* uncompressed"):
        read_shards(tmp_path, "train", report=ErrorPolicy("skip"), shards={"train": "z.tar.gz"})
    (tmp_path / "junk.tar").write_bytes(os.urandom(5000))
    with pytest.raises(DataError, match=r"junk\.tar: is not a readable tar"):
        read_shards(tmp_path, "train", report=ErrorPolicy("skip"), shards={"train": "junk.tar"})


def test_a_member_corrupt_past_its_header_is_skipped_when_decoded(tmp_path):
    """NaN samples pass the index's header check; decoding fails, named by shard and key, and
    on_error=skip replaces the item by the next and counts it."""
    buf = io.BytesIO()
    import soundfile as sf

    wave = sine(0.5, 16000)
    wave[100] = np.nan
    sf.write(buf, wave, 16000, format="WAV", subtype="FLOAT")
    _tar(tmp_path / "train" / "s.tar", {"nan.wav": buf.getvalue(), "nan.txt": b"bad",
                                         "ok.flac": _flac(), "ok.txt": b"good"})
    for split in ("val", "test"):
        _tar(tmp_path / split / "s.tar", {"ok.flac": _flac(), "ok.txt": b"good"})
    dm = _shard_dm(tmp_path, on_error="raise")
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=40))
    ds = dm._dataset("train", "full")
    with pytest.raises(DataError, match=r"s\.tar:nan\.wav \(s\.tar key nan\): has 1 NaN"):
        ds[(0, 0, 0)]
    dm = _shard_dm(tmp_path, on_error="skip")
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=40))
    out = dm._dataset("train", "full")[(0, 0, 0)]
    assert out["id"] == "ok" and out["_skipped"][0][0] == "non_finite"
    assert "s.tar key nan" in out["_skipped"][0][1]


def test_data_shards_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown split\(s\) \['dev'\]"):
        flat(ShardDataModule, root=str(tmp_path), shards={"dev": "x.tar"})
    with pytest.raises(ConfigError, match=r"reads format 'shards', not 'clotho'"):
        flat(ShardDataModule, root=str(tmp_path), shards={"train": "x"}, format="clotho")
    with pytest.raises(ConfigError, match=r"data\.shuffle_buffer \(-1\) must be >= 0"):
        flat(ShardDataModule, root=str(tmp_path), shards={"train": "x"}, shuffle_buffer=-1)
    with pytest.raises(ConfigError, match=r"data\.epoch_samples \(0\) must be >= 1"):
        flat(ShardDataModule, root=str(tmp_path), shards={"train": "x"}, epoch_samples=0)


# ---------------------------------------------------------------------------- the stream
SIZES = [5, 3, 4, 6, 2, 5, 5, 7]                     # 8 shards, 37 items
SHARD_OF = np.repeat(np.arange(len(SIZES)), SIZES)
N = len(SHARD_OF)


def _sampler(rank: int = 0, world: int = 1, **kw) -> ShardStreamSampler:
    args = dict(shard_of=SHARD_OF, streams=2, shuffle_buffer=4, batch_size=3, bucket_size=2,
                lengths=np.random.default_rng(1).uniform(1, 5, N), num_replicas=world,
                rank=rank, seed=7)
    return ShardStreamSampler(**{**args, **kw})


def _items(batches) -> list[int]:
    return [k[0] for b in batches for k in b]


def test_shuffle_buffer_is_a_permutation_that_stays_near_the_stream():
    stream = np.arange(1000)
    out = shuffle_buffer(stream, 50, np.random.default_rng(0))
    assert sorted(out.tolist()) == stream.tolist() and not np.array_equal(out, stream)
    # emitted at position k: an element that entered by position k + 49 (the buffer's reach)
    assert (out[:-50] <= np.arange(950) + 49).all()
    assert np.array_equal(shuffle_buffer(stream, 1, np.random.default_rng(0)), stream)


@pytest.mark.parametrize("drop_last", [False, True])
def test_two_ranks_by_two_streams_are_disjoint_and_cover_the_epoch(drop_last):
    """Every rank the same number of batches; the 4 streams' items disjoint; together every
    item once, except the stated remainder (< world: repeated from the pass's start, or
    dropped with drop_last)."""
    world = 2
    seen = []
    for rank in range(world):
        s = _sampler(rank, world, drop_last=drop_last)
        batches = s.batches(0)
        # a rank: 19 (18) examples = streams of 10 + 9 (9 + 9), pools of 6, batches of 3
        assert len(batches) == len(s) == (6 if drop_last else 7)
        seen.append(_items(batches))
    assert len(seen[0]) == len(seen[1])
    flat = seen[0] + seen[1]
    if drop_last:
        assert len(flat) == N - N % world and len(set(flat)) == len(flat)
    else:
        assert set(flat) == set(range(N)) and len(flat) == N + (-N) % world


def test_each_stream_reads_contiguous_shards_and_every_epoch_is_new():
    """Stream w's batches sit at positions w, w + 2, ... and read a run of whole shards
    (a stream's first and last shard may be shared with its neighbour)."""
    s = _sampler(shuffle_buffer=0, bucketing=False)
    batches = s.batches(0)
    for w in range(2):
        mine = _items(batches[w::2])
        shards = sorted(set(SHARD_OF[mine].tolist()))
        inner = shards[1:-1]
        assert all(set(np.flatnonzero(sh == SHARD_OF)) <= set(mine) for sh in inner)
        assert len(shards) <= len(SIZES) // 2 + 2
    assert _items(_sampler().batches(0)) == _items(_sampler().batches(0))   # a pure function
    assert _items(s.batches(0)) != _items(s.batches(1))
    assert sorted(_items(s.batches(1))) == list(range(N))


def test_epoch_samples_continue_the_stream_across_epochs():
    """An epoch of 10 is the next 10 of the stream: epochs 0-3 read the first pass (37 items)
    and 3 of the second; epochs 0-7 read two passes and 6 of the third."""
    s = _sampler(epoch_samples=10, streams=1, bucketing=False)
    epochs = [_items(s.batches(e)) for e in range(8)]
    assert all(len(e) == 10 for e in epochs) and len(s) == len(s.batches(3)) == 4
    for upto, passes in ((4, 1), (8, 2)):
        seen = Counter(sum(epochs[:upto], []))
        assert set(seen) == set(range(N)) and min(seen.values()) == passes
        assert sum(seen.values()) == 10 * upto
    assert not np.array_equal(s._pass(0, 0)[0][0], s._pass(1, 0)[0][0])  # the next pass is new
    two = _sampler(epoch_samples=10)                                  # 2 streams, bucketed
    assert set(sum((_items(two.batches(e)) for e in range(4)), [])) == set(range(N))


def test_caption_policy_all_streams_every_pair():
    s = _sampler(caption_policy="all", num_captions=[2] * N)
    keys = [(k[0], k[1]) for b in s.batches(0) for k in b]
    assert sorted(keys) == [(i, c) for i in range(N) for c in range(2)]


def test_a_position_saved_with_other_stream_settings_is_refused():
    state = _sampler().state_dict()
    with pytest.raises(UserError, match=r"streams=2 \(now 1\).* data\.loader\.num_workers"):
        _sampler(streams=1).load_state_dict(state)
    with pytest.raises(UserError, match=r"shuffle_buffer=4 \(now 8\)"):
        _sampler(shuffle_buffer=8).load_state_dict(state)
    with pytest.raises(UserError, match=r"cannot fill 2 rank\(s\) x 40 stream\(s\)"):
        _sampler(0, 2, streams=40)


# 12 shards of 20-39 items, lengths 1-30 s: big enough that the buffer (24) is a small
# part of a stream and bucketing shows.
BIG_SHARD_OF = np.repeat(np.arange(12), np.random.default_rng(2).integers(20, 40, 12))
BIG_LENGTHS = np.random.default_rng(3).uniform(1, 30, len(BIG_SHARD_OF))


def _big(**kw) -> ShardStreamSampler:
    args = dict(shard_of=BIG_SHARD_OF, lengths=BIG_LENGTHS, streams=2, shuffle_buffer=24,
                batch_size=4, seed=5, num_replicas=1, rank=0)
    return ShardStreamSampler(**{**args, **kw})


def _walk(s: ShardStreamSampler, epoch: int = 0, start: int = 0) -> tuple[int, int]:
    """Read the batches from ``start`` as loader workers do (batch k on worker k % streams,
    its fill read first): the most decoded items one worker holds (the batch included) and
    how many items had to be read alone. Every item read is handed out by the epoch's end."""
    batches, fills = s.batches(epoch), s.fills(epoch, start)
    held = [Counter() for _ in range(s.streams)]
    peak = alone = 0
    for k in range(start, len(batches)):
        h = held[k % s.streams]
        h.update(fills[k])
        peak = max(peak, h.total())
        for item, *_ in batches[k]:
            if h[item]:
                h[item] -= 1
            else:
                alone += 1
    assert all(h.total() == 0 for h in held)
    return peak, alone


def _spread(batches, lengths) -> float:
    """Mean within-batch length spread (longest - shortest)."""
    return float(np.mean([np.ptp(lengths[[k[0] for k in b]]) for b in batches]))


@pytest.mark.parametrize("mode", [{"batch_size": 4}, {"batch_size": None, "budget": 60.0}])
def test_bucketing_happens_inside_the_shuffle_buffer(mode):
    """A worker holds at most the buffer's items (count mode; with a budget one more batch
    when an epoch's batches are merged to the count); every item is read once into the buffer
    and once per pass handed out; batches are length-bucketed (spread far below a random
    order's batches of the same sizes)."""
    s = _big(**mode)
    assert s.buffer_size() == 24
    for epoch in range(3):
        batches = s.batches(epoch)
        assert sorted(_items(batches)) == list(range(len(BIG_SHARD_OF)))
        peak, alone = _walk(s, epoch)
        bound = s.buffer_size() + (0 if s.budget is None else max(len(b) for b in batches))
        assert alone == 0 and peak <= bound, (peak, bound)
        if s.budget is not None:
            assert all(len(b) == 1 or len(b) * BIG_LENGTHS[[k[0] for k in b]].max() <= 60.0
                       for b in batches)
        shuffled = np.random.default_rng(epoch).permutation(_items(batches))
        sizes = np.cumsum([len(b) for b in batches])[:-1]
        random = [[(int(i),) for i in part] for part in np.split(shuffled, sizes)]
        assert _spread(batches, BIG_LENGTHS) < 0.3 * _spread(random, BIG_LENGTHS)
    assert len({len(s.batches(e)) for e in range(6)}) == 1 == len({len(s)})


def test_a_budget_batch_bigger_than_the_buffer_still_makes_progress():
    """A budget that would take 100 items from a buffer of 5: each batch is what the buffer
    holds (every step takes at least its seed, so the loop ends); an item over the budget is
    a batch alone. In the sampler, short items under a budget sized by the mean length."""
    out = bucket_buffer(np.ones(50), 5, np.random.default_rng(0), budget=100.0)
    assert [len(b) for b in out] == [5] * 10
    assert sorted(np.concatenate(out).tolist()) == list(range(50))
    out = bucket_buffer(np.array([1.0, 200.0, 1.0, 1.0]), 2, None, budget=100.0)
    assert sorted(len(b) for b in out) == [1, 1, 2] and [1] in [b.tolist() for b in out]
    lengths = np.where(np.arange(len(BIG_SHARD_OF)) % 10 == 0, 50.0, 1.0)   # mean 5.9
    s = _big(lengths=lengths, batch_size=None, budget=60.0, shuffle_buffer=4)
    assert s.buffer_size() == 10                      # one batch of the mean length
    for epoch in range(2):
        batches = s.batches(epoch)
        assert sorted(_items(batches)) == list(range(len(lengths)))
        peak, alone = _walk(s, epoch)
        assert alone == 0 and peak <= 10 + max(len(b) for b in batches)


@pytest.mark.parametrize("mode", [{"batch_size": 4}, {"batch_size": None, "budget": 60.0}])
def test_a_resumed_stream_gives_the_same_batches_from_a_refilled_buffer(mode):
    """Resumed at any position: the same following batches, each served from the buffer its
    first fill rebuilds (nothing read alone), within the same memory bound."""
    s = _big(**mode, epoch_samples=200)
    s.set_epoch(2)
    whole = s.batches(2)
    for k in (1, 2, 7, len(whole) - 1):
        saved = _big(**mode, epoch_samples=200)
        saved.set_epoch(2)
        it = iter(saved)
        for _ in range(k):
            next(it)
        again = _big(**mode, epoch_samples=200)
        again.load_state_dict(saved.state_dict())
        got = [[key[:3] for key in b] for b in again]
        assert got == whole[k:]
        peak, alone = _walk(again, 2, k)
        assert alone == 0 and peak <= again.buffer_size() + max(len(b) for b in whole)


def test_a_mid_epoch_position_of_the_older_shard_order_is_refused_an_epoch_end_resumes():
    """Checkpoints from before bucketing moved into the buffer (no ``stream_order``): their
    mid-epoch position would continue into other batches, so it is refused in one line."""
    saved = _big(epoch_samples=200)
    saved.set_epoch(2)
    it = iter(saved)
    next(it)
    old = {k: v for k, v in saved.state_dict().items() if k != "stream_order"}
    with pytest.raises(UserError, match=r"middle of an epoch of shard order version 1.*"
                                        r"epoch's end"):
        _big(epoch_samples=200).load_state_dict(old)
    boundary = _big(epoch_samples=200)
    boundary.load_state_dict({**old, "epoch": 3, "position": 0})
    assert boundary.state.epoch == 3 and boundary.state.position == 0


class _Who(Dataset):
    """Returns the key's item and the worker that read it."""

    def __getitem__(self, key):
        return {"item": key[0], "worker": get_worker_info().id}

    def __len__(self) -> int:
        return N


def test_two_ranks_by_two_workers_read_their_own_streams():
    """A real loader with 2 workers per rank: worker w reads exactly stream w's items; the 4
    (rank, worker) readers are disjoint and cover the epoch."""
    readers: dict[tuple[int, int], set[int]] = {}
    for rank in range(2):
        s = _sampler(rank, 2)
        loader = DataLoader(_Who(), batch_sampler=s, num_workers=2,
                            collate_fn=lambda b: b, multiprocessing_context="fork")
        streams = {w: set(_items(s.batches(0)[w::2])) for w in range(2)}
        for batch in loader:
            for ex in batch:
                readers.setdefault((rank, ex["worker"]), set()).add(ex["item"])
        for w in range(2):
            assert readers[(rank, w)] == streams[w]
    sets = list(readers.values())
    assert len(sets) == 4 and sum(len(x) for x in sets) in (N, N + 1)
    assert set().union(*sets) == set(range(N))


@pytest.mark.parametrize(("num_workers", "batches"), [
    (0, {"batch_size": 2}), (2, {"batch_size": 2}),
    (0, {"batch_size": None, "max_seconds_per_batch": 2.0})])
def test_the_train_loader_resumes_mid_epoch(tiny_audio_captions, tmp_path, num_workers, batches):
    """Random crops, random captions, 0 or 2 workers (2 streams) reading the members; batches
    of 2, or by a seconds budget."""
    src = flat(CaptionDataModule, format="clotho", root=str(tiny_audio_captions))
    _shard_all(src, tmp_path)

    def loader():
        dm = _shard_dm(tmp_path, max_seconds=1.0, seed=3, shuffle_buffer=2,
                       num_workers=num_workers, **batches)
        dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=200))
        return dm.train_dataloader()

    def fp(b):
        return tuple(b["ids"]), round(float(b["audio"].double().sum()), 6)

    first = loader()
    assert isinstance(first, StatefulDataLoader) and len(first) >= 3
    if batches["batch_size"]:
        assert len(first) == 3 + (num_workers > 0)
    first.batch_sampler.set_epoch(1)
    it = iter(first)
    next(it)
    state = first.state_dict()
    rest = [fp(b) for b in it]
    again = loader()
    again.load_state_dict(state)
    assert [fp(b) for b in again] == rest and len(rest) == len(first) - 1


def test_data_check_scans_shards(tiny_audio_captions, tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    from mmtf.data.check import run_check
    from mmtf.utils.config_dir import CONF_DIR

    src = flat(CaptionDataModule, format="clotho", root=str(tiny_audio_captions))
    _shard_all(src, tmp_path)
    shutil.copy(tmp_path / "val" / "val-000000.tar", tmp_path / "val" / "val-000009.tar")
    with open(tmp_path / "val" / "val-000009.tar", "r+b") as f:   # break a member's header
        f.seek(512)
        f.write(os.urandom(64))
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("data_check", overrides=["data=shards", f"data.root={tmp_path}"])
    problems = run_check(cfg)
    out = capsys.readouterr().out
    assert "Shards read: train 3, val 3, test 2" in out
    assert problems >= 1 and "val-000009.tar" in out and "key " in out


def test_epoch_samples_and_channels_through_the_data_module(tiny_audio_captions, tmp_path):
    """data.epoch_samples sets the training loader's length (the LR schedule's); the index's
    channel count is checked against data.channels without reading the members."""
    src = flat(CaptionDataModule, format="clotho", root=str(tiny_audio_captions))
    _shard_all(src, tmp_path)
    dm = _shard_dm(tmp_path, batch_size=2, epoch_samples=10)
    dm.connect(CharTokenizer.train(dm.train_captions()))
    assert len(dm.train_dataloader()) == 5
    policy_dm = _shard_dm(tmp_path, channels=2, on_error="skip")
    assert policy_dm.items("train") == [] and policy_dm.error_counts["channels"] == 6
    with pytest.raises(DataError, match=r"key synth_development_\d+\): sample has 1 channel\(s\) "
                                        r"but data\.channels=2"):
        _shard_dm(tmp_path, channels=2).items("train")


# ---------------------------------------------------------------------------- duration budgets
def test_stream_batches_under_a_seconds_budget_on_two_ranks():
    """A budget cuts each stream's run: no batch over it (count x longest), equal counts on
    both ranks in every epoch, each item once per epoch as with a fixed batch size."""
    world, budget = 2, 9.0
    lengths = np.random.default_rng(1).uniform(1, 5, N)
    for epoch in range(3):
        seen, counts = [], []
        for rank in range(world):
            s = _sampler(rank, world, batch_size=None, budget=budget, lengths=lengths)
            batches = s.batches(epoch)
            counts.append(len(batches))
            assert len(s) == len(batches)
            for b in batches:
                longest = max(lengths[k[0]] for k in b)
                assert len(b) == 1 or len(b) * longest <= budget + 1e-9
            seen += _items(batches)
        assert counts[0] == counts[1]
        assert set(seen) == set(range(N)) and len(seen) == N + (-N) % world


def test_an_epoch_needing_more_budget_batches_than_the_count_merges_and_says_so(caplog):
    """Streams of 9 items, 2-3 per batch, vary between epochs more than the count's slack:
    epoch 14 emits more batches than epoch 0 set; the neighbours with the smallest merged
    padded size are merged (the count holds), and the warning names the biggest batch."""
    lengths = np.random.default_rng(1).uniform(1, 5, N)
    s = _sampler(0, 2, batch_size=None, budget=9.0, lengths=lengths)
    with caplog.at_level("WARNING", logger="mmtf.data"):
        batches = s.batches(14)
    assert len(batches) == len(s.batches(0)) == len(s)
    assert "emits more than its 7 batches per epoch (set by epoch 0) within the budget 9" in \
        caplog.text
    assert max(len(b) * lengths[[k[0] for k in b]].max() for b in batches) > 9.0


def test_image_shards_batch_by_pixels_from_the_index(tiny_image_captions, tmp_path):
    """max_pixels_per_batch on image shards reads sizes from the index (no member opened)."""
    src = flat(CaptionDataModule, format="coco", root=str(tiny_image_captions),
                            splits={"train": "train", "val": "val", "test": "test"})
    _shard_all(src, tmp_path, shard_size=4)
    dm = _shard_dm(tmp_path, modality="image", batch_size=None, max_pixels_per_batch=2500)
    sizes = dm._image_sizes("train")
    # the same sizes as the source files' headers, read without the files
    by_id = dict(zip([it.id for it in src.items("train")],
                     CaptionDataModule._image_sizes(src, "train")))
    assert sizes == [by_id[it.id] for it in dm.items("train")]
    sampler = dm.batch_sampler("train")
    per_image = sizes[0][0] * sizes[0][1]
    assert all(len(b) <= max(1, 2500 // per_image) for b in sampler.batches(0))
    assert sorted(_items(sampler.batches(0))) == list(range(len(dm.items("train"))))


# ---------------------------------------------------------------------------- reads per epoch
def test_an_epoch_streams_each_shard_front_to_back_once(tmp_path, monkeypatch):
    """On an object store (read-ahead blocks of 1 KiB, far smaller than a shard, like 4 MiB
    blocks against real shards), one epoch reads each shard front to back: no fetch behind
    the last one, each byte at most once; a resumed epoch too (it refills its buffer). One
    ranged read per clip in the emitted order went back and forth and re-read bytes. The
    reading process holds at most the shuffle buffer's 8 items (the batch included)."""
    held: list[int] = []
    fill = shards_reader.ShardCaptionDataset._fill

    def counted_fill(self, items):
        fill(self, items)
        held.append(sum(len(v) for v in self._held.values()))

    monkeypatch.setattr(shards_reader.ShardCaptionDataset, "_fill", counted_fill)
    monkeypatch.setattr(shards_reader._READER, "block_size", 1024)
    monkeypatch.setattr(shards_reader._READER, "_files", OrderedDict())
    fsspec.register_implementation("countmem", CountingMemory, clobber=True)
    fs = fsspec.filesystem("countmem")
    total = 0
    for s in range(3):
        local = _tar(tmp_path / f"{s}.tar", {
            m: d for k in range(24) for m, d in (
                (f"s{s}k{k:02d}.flac", _flac(0.2 + 0.05 * (k % 5), 300 + 20 * k)),
                (f"s{s}k{k:02d}.json", json.dumps({"caption": f"tone {s} {k}"}).encode()))})
        fs.pipe(f"/shards/{s}.tar", local.read_bytes())
        total += local.stat().st_size

    def loader():
        dm = _shard_dm(tmp_path, shards={"train": "countmem://shards/{0..2}.tar"}, batch_size=4,
                       shuffle_buffer=8, index_cache=str(tmp_path / "cache"), seed=1)
        dm.connect(CharTokenizer.train(dm.train_captions()))
        return dm, dm.train_dataloader()

    try:
        dm, first = loader()
        fs.reset()                          # the scans that built the indexes are not the epoch
        ids = [i for b in first for i in b["ids"]]
        assert sorted(ids) == sorted(it.id for it in dm.items("train"))
        assert fs.bytes_read <= total and not fs.backward, (fs.bytes_read, total, fs.backward)
        assert fs.requests < len(ids), fs.requests
        assert 0 < max(held) <= first.batch_sampler.buffer_size() == 8, held
        # A resumed epoch refills the buffer it had: the same examples, read once.
        it = iter(first)
        head = [next(it) for _ in range(5)]
        state, rest = first.state_dict(), [b["ids"] for b in it]
        _, again = loader()
        again.load_state_dict(state)
        fs.reset()
        assert [b["ids"] for b in again] == rest and head and max(held) <= 8
        assert fs.bytes_read <= total and not fs.backward, (fs.bytes_read, total, fs.backward)
    finally:
        fs.rm("/shards", recursive=True)
