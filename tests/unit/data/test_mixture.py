"""data=mixture: the sampler's draws (frequencies, each source's own stream order, DDP, resume),
the data module over map-style sources (built-in Clotho layout + a manifest written here), the
per-source prompt token and every bad input with its message."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from mmtf.data import CaptionDataModule, ClassificationDataModule
from mmtf.data.mixture import MixtureDataModule, MixtureDataset, MixtureSampler
from mmtf.data.sampler import BucketBatchSampler
from mmtf.errors import ConfigError, UserError
from mmtf.text import BPETokenizer, build_tokenizer
from tests.unit.presets import flat


# ---------------------------------------------------------------------------- the sampler
def child(n: int, *, seed: int = 0, rank: int = 0, world: int = 1, caps: int = 1,
          policy: str = "first") -> BucketBatchSampler:
    rng = np.random.default_rng(n)
    return BucketBatchSampler(lengths=rng.uniform(1, 5, n).tolist(), batch_size=4,
                              num_captions=[caps] * n, caption_policy=policy, seed=seed,
                              num_replicas=world, rank=rank)


def mixture(sizes, weights, *, epoch_samples=None, rank=0, world=1, caps=1, policy="first",
            seed=3, batch_size=8) -> MixtureSampler:
    children = [child(n, seed=10 + k, rank=rank, world=world, caps=caps, policy=policy)
                for k, n in enumerate(sizes)]
    lengths = np.concatenate([c.lengths for c in children])
    return MixtureSampler(sources=children, weights=weights, names=[f"s{k}" for k in
                                                                    range(len(sizes))],
                          offsets=np.cumsum([0, *sizes[:-1]]).tolist(),
                          epoch_samples=epoch_samples, lengths=lengths.tolist(),
                          num_captions=[caps] * int(lengths.size), caption_policy=policy,
                          batch_size=batch_size, seed=seed, num_replicas=world, rank=rank)


def test_source_frequencies_are_within_two_percent_of_the_weights_over_10k_draws():
    weights = [0.2, 0.3, 0.5]
    sampler = mixture([7, 50, 400], [2, 3, 5], epoch_samples=10_000)
    items = np.concatenate([np.array([k[0] for k in b]) for b in sampler.batches(0)])
    assert items.size == 10_000
    share = np.bincount(np.searchsorted([7, 57], items, side="right"), minlength=3) / items.size
    assert np.abs(share - weights).max() < 0.02, share
    # and the counts it logs are the draws'
    assert sampler.source_counts(0) == dict(zip(["s0", "s1", "s2"],
                                                (int(c) for c in share * 10_000)))


def test_each_source_is_read_in_its_own_samplers_order_across_its_epochs():
    sampler = mixture([5, 9], [1, 1], epoch_samples=14, caps=3, policy="random")
    drawn = {0: [], 1: []}
    for epoch in range(4):                       # walking order (before bucketing)
        items, caps = sampler.rank_examples(epoch)
        for item, cap in zip(items, caps):
            k = int(item >= 5)
            drawn[k].append((int(item) - 5 * k, int(cap)))
    for k, src in enumerate(sampler.sources):
        stream = []
        for e in range(12):
            local, cap = src.rank_examples(e)
            # the source epoch rides in the caption slot: caption + num_captions * epoch
            stream += [(int(i), int(c) + 3 * e) for i, c in zip(local, cap)]
        assert drawn[k] == stream[:len(drawn[k])]
        assert len(drawn[k]) > 2 * len(src.lengths)          # it went past its first epochs


def test_order_is_a_pure_function_of_seed_and_epoch_so_a_fresh_sampler_resumes_it():
    walked = mixture([6, 11], [0.4, 0.6], epoch_samples=30)
    for epoch in range(3):
        walked.batches(epoch)
    fresh = mixture([6, 11], [0.4, 0.6], epoch_samples=30)
    assert fresh.batches(3) == walked.batches(3)            # replayed counts, not state
    assert len(fresh.batches(3)) == len(fresh) == 4
    other = mixture([6, 11], [0.4, 0.6], epoch_samples=30, seed=4)
    assert other.batches(3) != walked.batches(3)


def test_mid_epoch_position_resumes_through_state_dict():
    sampler = mixture([6, 11], [0.4, 0.6], epoch_samples=40, batch_size=4)
    it = iter(sampler)
    seen = [next(it) for _ in range(3)]
    state = sampler.state_dict()
    resumed = mixture([6, 11], [0.4, 0.6], epoch_samples=40, batch_size=4)
    resumed.load_state_dict(state)
    assert seen + list(resumed) == sampler.batches(0)


def test_state_saved_with_other_weights_or_sources_is_refused():
    state = mixture([6, 11], [0.4, 0.6]).state_dict()
    with pytest.raises(UserError, match=r"weights=\[0\.4, 0\.6\] \(now \[0\.5, 0\.5\]\)"):
        mixture([6, 11], [0.5, 0.5]).load_state_dict(state)
    with pytest.raises(UserError, match=r"source_items=\[6, 11\] \(now \[6, 12\]\)"):
        mixture([6, 12], [0.4, 0.6]).load_state_dict(state)


def test_two_ranks_draw_from_their_own_split_of_each_source_with_equal_batch_counts():
    ranks = [mixture([8, 20], [1, 1], epoch_samples=27, rank=r, world=2) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(ranks[0].batches(0)) == len(ranks[1].batches(0))
    for sampler in ranks:
        items, _ = sampler.rank_examples(0)
        assert items.size == 14                              # ceil(27 / 2)
        for k, src in enumerate(sampler.sources):
            local = items[(items >= sampler.offsets[k]) &
                          (items < sampler.offsets[k] + len(src.lengths))] - sampler.offsets[k]
            stream = np.concatenate([src.rank_examples(e)[0] for e in range(4)])
            assert local.tolist() == stream[:local.size].tolist()
    # within a source's epoch the ranks hold disjoint items (its own DDP split)
    first = [set(s.sources[1].rank_examples(0)[0].tolist()) for s in ranks]
    assert not first[0] & first[1]


def test_bad_sampler_arguments_name_the_fix():
    with pytest.raises(UserError, match=r"weight must be a finite number > 0; got s1=0\.0"):
        mixture([4, 4], [1, 0])
    with pytest.raises(UserError, match=r"epoch_samples \(0\) must be a positive int"):
        mixture([4, 4], [1, 1], epoch_samples=0)
    with pytest.raises(UserError, match=r"source 's0' samples for \(num_replicas, rank\) "
                                        r"\(1, 0\), the mixture for \(2, 1\)"):
        MixtureSampler(sources=[child(4)], weights=[1], names=["s0"], offsets=[0],
                       lengths=[1.0] * 4, num_captions=[1] * 4, num_replicas=2, rank=1)


# ---------------------------------------------------------------------------- the data module
def manifest(root: Path, clips: Path, *, captions: str = "a manifest clip") -> Path:
    """A manifest source over the Clotho-layout clips of ``clips`` (train/val/test.jsonl)."""
    root.mkdir(parents=True, exist_ok=True)
    folders = {"train": "development", "val": "validation", "test": "evaluation"}
    for split, folder in folders.items():
        lines = [json.dumps({"audio": str(p), "caption": [f"{captions} {i}", f"{captions}"]})
                 for i, p in enumerate(sorted((clips / folder).glob("*.wav")))]
        (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def clotho_source(root: Path, **kw) -> dict:
    return {"_target_": "mmtf.data.CaptionDataModule", "format": "clotho", "root": str(root),
            "max_seconds": 1.5, **kw}


def manifest_source(root: Path, **kw) -> dict:
    return {"_target_": "mmtf.data.CaptionDataModule", "format": "manifest",
            "modality": "audio", "root": str(root), **kw}


@pytest.fixture
def two_sources(tiny_audio_captions, tmp_path) -> dict:
    return {"clotho": {**clotho_source(tiny_audio_captions), "weight": 1.0,
                       "prompt_token": "<|clotho|>"},
            "wavcaps": {**manifest_source(manifest(tmp_path / "m", tiny_audio_captions)),
                        "weight": 3.0, "prompt_token": "<|wavcaps|>"}}


def connected(dm: MixtureDataModule) -> MixtureDataModule:
    dm.setup("fit")
    dm.connect(build_tokenizer(dm.tokenizer_spec({"kind": "bpe", "vocab_size": 64}),
                               dm.train_captions))
    return dm


def test_items_are_the_sources_concatenated_and_batches_carry_the_source(two_sources, caplog):
    caplog.set_level(logging.INFO, logger="mmtf.data")
    dm = connected(flat(MixtureDataModule, sources=two_sources, batch_size=4, epoch_samples=10))
    assert len(dm.items("train")) == 12 and dm.source_names == ("clotho", "wavcaps")
    assert [it.captions[-1] for it in dm.items("train")[6:]] == ["a manifest clip"] * 6
    batches = list(dm.train_dataloader())
    assert sum(len(b["ids"]) for b in batches) == 10 == len(dm.train_dataloader()) * 4 - 2
    for b in batches:
        for source, id_, row in zip(b["sources"], b["ids"], b["tokens"]):
            assert id_.startswith(f"{source}/")
            # the source's prompt token in the prompt's last place
            assert row[:2].tolist() == [1, dm.tokenizer.token_to_id(f"<|{source}|>")]
    val = list(dm.val_dataloader())
    assert sorted(s for b in val for s in b["sources"]) == ["clotho"] * 3 + ["wavcaps"] * 3
    # the [data] lines: items per source at setup, draws per source each epoch
    counts = dm._loaders["train"].batch_sampler.source_counts(0)
    drawn = [s for b in batches for s in b["sources"]]
    assert counts == {"clotho": drawn.count("clotho"), "wavcaps": drawn.count("wavcaps")}
    assert (f"[data] mixture train epoch 0 (rank 0): clotho {counts['clotho']} "
            f"({10 * counts['clotho']:.1f}%), wavcaps {counts['wavcaps']}") in caplog.text
    assert "[data] mixture train: 12 items: clotho 6 (clotho at" in caplog.text
    assert "weight 0.750)" in caplog.text


def test_a_source_keeps_its_own_crop_and_its_epoch_reaches_its_dataset(two_sources):
    two_sources["wavcaps"]["max_seconds"] = 0.5
    dm = connected(flat(MixtureDataModule, sources=two_sources, batch_size=2, epoch_samples=40,
                                     bucketing=False))
    ds = dm._dataset("train", "random")
    assert isinstance(ds, MixtureDataset)
    # item 6 (wavcaps' first) in source epochs 0 and 1: its crops are those of its own
    # dataset at those epochs (0.5 s, random per epoch)
    n = dm._num_captions("train")[6]
    a, b = ds[(6, 0, 0)]["audio"], ds[(6, n * 1, 0)]["audio"]
    own = dm.sources[1].module._dataset("train", "random")
    assert a.shape[0] == 8000 and torch.equal(a, own[(0, 0, 0)]["audio"])
    assert torch.equal(b, own[(0, 0, 1)]["audio"]) and not torch.equal(a, b)
    assert torch.equal(ds[(0, 0, 0)]["audio"],
                       dm.sources[0].module._dataset("train", "random")[(0, 0, 0)]["audio"])


def test_a_source_without_evaluation_is_left_out_of_val_and_test(two_sources):
    two_sources["wavcaps"]["evaluate"] = False
    dm = flat(MixtureDataModule, sources=two_sources)
    assert dm.source_names == ("clotho",)
    assert len(dm.items("val")) == 3 and len(dm.items("train")) == 12


def test_the_trained_tokenizer_gets_the_tokens_and_the_default_sources_prompt(two_sources):
    dm = flat(MixtureDataModule, sources=two_sources, default_source="wavcaps")
    spec = dm.tokenizer_spec({"kind": "bpe", "vocab_size": 64, "special_tokens": ["<|x|>"]})
    assert spec["special_tokens"] == ["<|x|>", "<|clotho|>", "<|wavcaps|>"]
    assert spec["prompt"] == ["<bos>", "<|wavcaps|>"]
    tok = build_tokenizer(spec, dm.train_captions)
    assert [tok.id_to_token(i) for i in tok.prompt_ids] == ["<bos>", "<|wavcaps|>"]
    assert tok.decode([1, tok.token_to_id("<|clotho|>"), *tok.encode("a dog")[1:]]) == "a dog"
    assert dm.tokenizer_spec({"kind": "char"}) == {"kind": "char"}   # not grown: connect says


def test_a_tokenizer_without_the_prompt_tokens_is_refused(two_sources):
    dm = flat(MixtureDataModule, sources=two_sources)
    plain = BPETokenizer.train(dm.train_captions(), vocab_size=64)
    with pytest.raises(ConfigError, match=r"prompt tokens <\|clotho\|> \(clotho\), "
                                          r"<\|wavcaps\|> \(wavcaps\) are not special tokens"
                                          r".*is not grown"):
        dm.connect(plain)
    odd = BPETokenizer.train(dm.train_captions(), vocab_size=64,
                             special_tokens=["<|clotho|>", "<|wavcaps|>"])
    with pytest.raises(ConfigError, match=r"prompt \['<bos>'\] does not end with a source's "
                                          r"prompt token"):
        dm.connect(odd)


def test_bad_sources_are_one_line_errors_naming_the_source(two_sources, tmp_path):
    def make(sources, **kw):
        return flat(MixtureDataModule, sources=sources, **kw)

    with pytest.raises(ConfigError, match=r"data.sources.clotho \(clotho\): weight \(0\) must "
                                          r"be a number > 0"):
        make({**two_sources, "clotho": {**two_sources["clotho"], "weight": 0}})
    with pytest.raises(ConfigError, match=r"weight \(-1\.0\) must be a number > 0"):
        make({**two_sources, "clotho": {**two_sources["clotho"], "weight": -1.0}})
    with pytest.raises(ConfigError, match=r"data.sources\[0\]: name \(None\) must be"):
        make([{k: v for k, v in two_sources["clotho"].items()}])
    with pytest.raises(ConfigError, match=r"the name 'a' is used by two sources"):
        make([{**two_sources["clotho"], "name": "a"}, {**two_sources["wavcaps"], "name": "a"}])
    with pytest.raises(ConfigError, match=r"data.sources is empty"):
        make({})
    image = {**manifest_source(tmp_path), "modality": "image", "weight": 1.0,
             "prompt_token": "<|img|>"}
    with pytest.raises(ConfigError, match=r"modality differs between sources \(clotho='audio', "
                                          r"wavcaps='audio', coco='image'\); a mixture is of "
                                          r"one modality"):
        make({**two_sources, "coco": image})
    with pytest.raises(ConfigError, match=r"sample_rate differs between sources \(clotho=16000,"
                                          r" wavcaps=22050\)"):
        make({**two_sources, "wavcaps": {**two_sources["wavcaps"], "sample_rate": 22050}})
    with pytest.raises(ConfigError, match=r"prompt_token is set on \['clotho'\] but not on "
                                          r"\['wavcaps'\]"):
        make({**two_sources, "wavcaps": {**two_sources["wavcaps"], "prompt_token": None}})
    with pytest.raises(ConfigError, match=r"augment.mixup mixes pairs of one batch"):
        make({**two_sources, "wavcaps": {**two_sources["wavcaps"],
                                         "augment": {"mixup": {"p": 0.5}}}})
    with pytest.raises(ConfigError, match=r"data.sources.esc \(esc\): "
                                          r"ClassificationDataModule is not a caption data"):
        make({**two_sources, "esc": {"_target_": "mmtf.data.ClassificationDataModule",
                                     "format": "esc50", "root": str(tmp_path), "weight": 1.0,
                                     "prompt_token": "<|esc|>"}})
    with pytest.raises(ConfigError, match=r"data.sources.x \(x\): no _target_"):
        make({**two_sources, "x": {"weight": 1.0, "root": "/data", "prompt_token": "<|x|>"}})
    with pytest.raises(ConfigError, match=r"data.default_source \('y'\) must be one of"):
        make(two_sources, default_source="y")
    with pytest.raises(ConfigError, match=r"data.augment is set on the mixture, but it is each "
                                          r"source's setting; set data.sources.<name>.augment"):
        make(two_sources, augment={"gain": {"p": 0.5}})


def test_modules_can_be_given_directly(tiny_audio_captions):
    a = flat(CaptionDataModule, format="clotho", root=str(tiny_audio_captions))
    dm = flat(MixtureDataModule, sources=[{"name": "a", "weight": 1, "module": a}])
    assert dm.sources[0].module is a and len(dm.items("test")) == 3
    assert not isinstance(dm, ClassificationDataModule)


# ---------------------------------------------------------------------------- shards and budgets
def test_a_shards_source_mixes_in_its_stream_order_and_decodes(two_sources, tmp_path):
    """A ShardDataModule source: its draws follow its own ShardStreamSampler's walking order
    across its epochs, and its items decode to the audio of the files they were written from."""
    from mmtf.data.shards.writer import write_shards

    spec = {k: v for k, v in clotho_source(Path(two_sources["clotho"]["root"])).items()
            if k != "_target_"}
    clotho = flat(CaptionDataModule, **spec)
    for split in ("train", "val", "test"):
        write_shards(clotho.items(split), tmp_path / "sh" / split, prefix=split, shard_size=2)
    sources = {"wavcaps": two_sources["wavcaps"],
               "shards": {"_target_": "mmtf.data.shards.ShardDataModule", "format": "shards",
                          "root": str(tmp_path / "sh"), "max_seconds": 1.5, "weight": 1.0,
                          "prompt_token": "<|shards|>",
                          "shards": {s: f"{s}/*.tar" for s in ("train", "val", "test")}}}
    dm = connected(flat(MixtureDataModule, sources=sources, batch_size=3, epoch_samples=12))
    shard_src = dm.sources[1].module
    stream = shard_src.batch_sampler("train")
    assert type(stream).__name__ == "ShardStreamSampler"
    sampler = dm.batch_sampler("train")
    offset = dm._offsets["train"][1]
    items, _ = sampler.rank_examples(0)                  # walking order, before bucketing
    walked = [int(i) - offset for i in items if i >= offset]
    expected = [int(i) for e in range(3) for i in stream.rank_examples(e)[0]][:len(walked)]
    assert 0 < len(walked) < 12 and walked == expected
    drawn = sorted(k[0] - offset for b in sampler.batches(0) for k in b if k[0] >= offset)
    assert drawn == sorted(walked)
    # val: whole clips (a training crop is drawn per item index, which the shards reorder)
    clotho.connect(dm.tokenizer)
    src_ds, ds = clotho._dataset("val", "full"), dm._dataset("val", "full")
    by_id = {it.id: i for i, it in enumerate(clotho.items("val"))}
    offset = dm._offsets["val"][1]
    for i, item in enumerate(shard_src.items("val")):
        got = ds[(offset + i, 0, 0)]
        assert got["source"] == "shards"
        torch.testing.assert_close(got["audio"], src_ds[(by_id[item.id], 0, 0)]["audio"])


def test_a_mixture_batches_by_a_seconds_budget(two_sources):
    dm = connected(flat(MixtureDataModule, sources=two_sources, batch_size=None,
                                     max_seconds_per_batch=3.2, epoch_samples=24))
    sampler = dm.batch_sampler("train")
    lengths = sampler.lengths
    batches = sampler.batches(0)
    assert len(sampler) == len(batches) and sum(len(b) for b in batches) == 24
    assert all(len(b) == 1 or len(b) * max(lengths[k[0]] for k in b) <= 3.2 + 1e-9
               for b in batches)
    assert any(len(b) > 1 for b in batches)
