"""Instruction items through shards (a round trip keeps every item's messages, question fields
and instruction) and mixtures (AQA + captions with an instruction in one prefix-LLM run)."""

from __future__ import annotations

import json
import tarfile

import pytest
from omegaconf import OmegaConf

from mmtf.data import CaptionDataModule
from mmtf.data.mixture import MixtureDataModule
from mmtf.data.shards import ShardDataModule, shard_dataset, write_shards
from mmtf.errors import ConfigError, DataError, UserError
from mmtf.metrics.aqa import format_messages
from tests.unit.data.chat_fixtures import chat, template, tiny_tokenizer, write_clips, write_split
from tests.unit.data.conftest import TINY_AUDIO

BATCHES = {"batch_size": 4, "bucketing": False}
LOADER = {"num_workers": 0}
CHOICES = ["low tone", "high tone", "rising chirp", "slow click train"]
MULTI = [{"role": "system", "content": "You describe sounds."},
         {"role": "user", "content": "<|audio|>\nWhat is this?"},
         {"role": "assistant", "content": "A dog.", "train": False},
         {"role": "user", "content": "More detail."},
         {"role": "assistant", "content": "A dog barks twice far away."}]


@pytest.fixture()
def mixed_set(tmp_path):
    """An instruction set of a multi-turn chat, a two-turn one and two questions."""
    root = tmp_path / "chats"
    write_clips(root, ["a", "b", "q1", "q2"], [0.5, 0.25, 0.5, 0.75])
    lines = [{"id": "a", "audio": "audio/a.wav", "messages": MULTI},
             {"id": "b", "audio": "audio/b.wav", "references": ["a dog", "a barking dog"],
              "messages": chat("<|audio|>\nDescribe the sound.", "A dog barks.")}]
    lines += [{"id": f"q{k}", "audio": f"audio/q{k}.wav", "question_type": kind,
               "question": "Which sound is heard?", "choices": CHOICES, "answer": answer,
               "messages": format_messages("Which sound is heard?", CHOICES, answer)}
              for k, kind, answer in ((1, "presence", "rising chirp"), (2, "count", "low tone"))]
    for split in ("train", "val", "test"):
        write_split(root, split, lines)
    return root


def chats(root, **kw):
    return CaptionDataModule(format="instruction", modality="audio", root=str(root),
                             batches=BATCHES, loader=LOADER, **kw)


def shards(root, **kw):
    return ShardDataModule(root=str(root), batches=BATCHES, loader=LOADER,
                           shards={s: f"{s}/*.tar" for s in ("train", "val", "test")}, **kw)


def tokenizer_for(*modules):
    return tiny_tokenizer([t for m in modules for t in m.train_captions()] +
                          ["Which sound is heard? Answer with the letter. (A) (B) (C) (D)",
                           *CHOICES, "You describe sounds."])


def test_a_shard_round_trip_keeps_every_items_messages_and_question(mixed_set, tmp_path):
    src = chats(mixed_set)
    out = tmp_path / "shards"
    for split in ("train", "val", "test"):
        write_shards(src.items(split), out / split, prefix=split, shuffle_seed=0)
    back = shards(out)
    for split in ("train", "val"):
        before = {i.id: i for i in src.items(split)}
        after = {i.id: i for i in back.items(split)}
        assert sorted(after) == sorted(before)
        for key, item in before.items():
            assert after[key].messages == item.messages      # train: false flags included
            assert after[key].qa == item.qa and after[key].captions == item.captions
    # What the shard holds is plain JSON a WebDataset user reads too.
    with tarfile.open(next((out / "train").glob("*.tar"))) as tar:
        metas = [json.load(tar.extractfile(m)) for m in tar if m.name.endswith(".json")]
    q1 = next(m for m in metas if m["id"] == "q1")
    assert q1["choices"] == CHOICES and q1["answer"] == "rising chirp"
    assert q1["messages"][0]["content"].startswith("<|audio|>")
    # The same batches from the shards as from the JSONL (ids equal item by item).
    tok = tokenizer_for(src)
    for dm in (src, back):
        dm.connect(tok, chat_template=template())
    for split in ("train", "val"):
        enc = {i.id: v for i, v in zip(src.items(split), src.tokens(split))}
        for item, variants in zip(back.items(split), back.tokens(split)):
            assert [v.input_ids.tolist() for v in variants] == \
                [v.input_ids.tolist() for v in enc[item.id]]
            assert [v.labels.tolist() for v in variants] == \
                [v.labels.tolist() for v in enc[item.id]]
    batch = next(iter(back.val_dataloader()))
    assert {"media", "media_mask", "input_ids", "labels", "prompt_ids", "prompt_mask",
            "choices", "answer", "question_type", "references"} <= set(batch)
    train = [b for b in back.train_dataloader()]          # the shard stream sampler
    assert sorted(i for b in train for i in b["ids"]) == ["a", "b", "q1", "q2"]
    assert all("prompt_ids" not in b for b in train)


def test_a_caption_set_sharded_with_an_instruction_keeps_it(tmp_path):
    data = {"_target_": "mmtf.synthetic.SyntheticCaptionDataModule", "format": "clotho",
            "root": str(tmp_path / "caps"), "instruction": "Describe the sound.",
            "synthetic": {"kind": "audio_captions", **TINY_AUDIO},
            "batches": BATCHES, "loader": LOADER}
    cfg = OmegaConf.create({"data": data, "out": str(tmp_path / "shards"),
                            "splits": ["train", "val"], "shard_size": 4, "shard_bytes": None,
                            "shuffle": True, "seed": 0})
    shard_dataset(cfg)
    from hydra.utils import instantiate

    src = instantiate(OmegaConf.create(data))
    back = shards(tmp_path / "shards")            # no data.instruction: the items carry it
    assert {i.instruction for i in back.items("train")} == {"Describe the sound."}
    tok = tokenizer_for(src)
    for dm in (src, back):
        dm.connect(tok, chat_template=template())
    enc = {i.id: v for i, v in zip(src.items("train"), src.tokens("train"))}
    for item, variants in zip(back.items("train"), back.tokens("train")):
        assert len(variants) == len(item.captions) > 1     # one chat per caption
        assert [v.input_ids.tolist() for v in variants] == \
            [v.input_ids.tolist() for v in enc[item.id]]


def test_a_shard_with_a_bad_chat_is_named(tmp_path, mixed_set):
    src = chats(mixed_set)
    item = src.items("train")[1]
    import dataclasses

    broken = dataclasses.replace(item, messages=tuple(chat("no placeholder", "x")))
    write_shards([broken], tmp_path / "train", prefix="train", shuffle_seed=None)
    dm = shards(tmp_path)
    with pytest.raises(DataError, match=r"train-000000.tar \(key b\): sample b: 'messages' "
                                        r"holds the media placeholder <\|audio\|> 0 times"):
        dm.items("train")


# ---------------------------------------------------------------------------- mixtures
def caption_source(tmp_path, **kw):
    from mmtf.synthetic import SyntheticCaptionDataModule

    return SyntheticCaptionDataModule(
        format="clotho", root=str(tmp_path / "caps"), batches=BATCHES, loader=LOADER,
        synthetic={"kind": "audio_captions", **TINY_AUDIO}, **kw)


def test_a_mixture_mixes_questions_and_captions_with_an_instruction(mixed_set, tmp_path):
    qa = chats(mixed_set, rotations=2)
    caps = caption_source(tmp_path, instruction="Describe the sound.")
    mix = MixtureDataModule(sources={"qa": {"module": qa, "weight": 1.0},
                                     "caps": {"module": caps, "weight": 1.0}},
                            batches={"batch_size": 64, "bucketing": False}, loader=LOADER)
    tok = tokenizer_for(qa, caps)
    mix.connect(tok, chat_template=template())
    assert qa.chat_template is mix.chat_template is caps.chat_template
    train = next(iter(mix.train_dataloader()))
    assert set(train["sources"]) == {"qa", "caps"}
    # Each example is its source's own chat, its id prefixed with the source.
    own = {f"qa/{i.id}": v for i, v in zip(qa.items("train"), qa.tokens("train"))}
    own |= {f"caps/{i.id}": v for i, v in zip(caps.items("train"), caps.tokens("train"))}
    for row, item_id in enumerate(train["ids"]):
        ids = train["input_ids"][row][train["attention_mask"][row]].tolist()
        assert ids in [v.input_ids.tolist() for v in own[item_id]]
    val = next(iter(mix.val_dataloader()))
    rows = {(i, r) for i, r in zip(val["ids"], val["rotation"])}
    assert {("qa/q1", 0), ("qa/q1", 1), ("qa/q2", 0), ("qa/q2", 1)} <= rows
    for row, item_id in enumerate(val["ids"]):
        if item_id.startswith("caps/"):
            assert val["choices"][row] is None and val["answer"][row] is None
            assert len(val["references"][row]) > 1
        elif item_id in ("qa/q1", "qa/q2"):
            assert val["answer"][row] in CHOICES and len(val["choices"][row]) == 4
    assert mix.train_captions()[-1] == "Describe the sound."
    from mmtf.metrics.aqa import AQAAccuracy

    metric = AQAAccuracy(mix.questions("val"), rotations=2)
    asked = [row for row, c in enumerate(val["choices"]) if c is not None]
    metric.update([val["ids"][r] for r in asked], [val["rotation"][r] for r in asked],
                  [val["references"][r][0] for r in asked], [val["answer"][r] for r in asked])
    assert metric.compute()["strict_accuracy"] == 1.0


def test_a_chat_mixture_refuses_prompt_tokens_and_captions_without_an_instruction(
        mixed_set, tmp_path):
    qa, caps = chats(mixed_set), caption_source(tmp_path)
    tok = tokenizer_for(qa, caps)
    marked = MixtureDataModule(sources={
        "qa": {"module": qa, "weight": 1.0, "prompt_token": "<|qa|>"},
        "caps": {"module": caps, "weight": 1.0, "prompt_token": "<|caps|>"}},
        batches=BATCHES, loader=LOADER)
    with pytest.raises(ConfigError, match="prompt_token is set on"):
        marked.connect(tok, chat_template=template())
    plain = MixtureDataModule(sources={"qa": {"module": qa, "weight": 1.0},
                                       "caps": {"module": caps, "weight": 1.0}},
                              batches=BATCHES, loader=LOADER)
    plain.connect(tok, chat_template=template())
    with pytest.raises(UserError, match=r"needs an instruction; .*data.sources.<name>."
                                        r"instruction"):
        plain.tokens("train")
    with pytest.raises(ConfigError, match="data.instruction is set on the mixture"):
        MixtureDataModule(sources={"qa": {"module": qa, "weight": 1.0}},
                          instruction="Describe the sound.")
