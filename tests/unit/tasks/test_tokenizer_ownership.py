"""The captioning task's tokenizer: handed over by the caller (never built by a hook), checked
against the decoder, the data module and every restored checkpoint, saved in its checkpoints."""

from __future__ import annotations

import hashlib

import pytest
import torch
from omegaconf import OmegaConf

from mmtf.errors import CheckpointError, ConfigError, UserError
from mmtf.tasks import build_task, resolve_tokenizer, stored_tokenizer
from mmtf.tasks.resolve import check_same_tokenizer_on_every_rank
from mmtf.text import CharTokenizer
from mmtf.train import connect_tokenizer

from .conftest import captioner, classifier, fake_datamodule

TEXTS = ["a high beep", "a low tone then noise"]


def _checkpoint(tokenizer) -> dict:
    return {"mmtf": {"config": {"model": {}}, "tokenizer": tokenizer.to_json_str()}}


def test_the_handed_over_tokenizer_is_checked_on_load_and_saved_back():
    stored = CharTokenizer.train(TEXTS)
    task = captioner()
    task.use_tokenizer(stored_tokenizer(_checkpoint(stored)))
    task.on_load_checkpoint(_checkpoint(stored))
    assert task.tokenizer == stored
    saved: dict = {}
    task.on_save_checkpoint(saved)
    assert saved["mmtf"]["tokenizer"] == stored.to_json_str()
    assert stored_tokenizer({"mmtf": {"config": {}, "tokenizer": None}}) is None


def test_on_load_checkpoint_never_adopts_a_tokenizer_itself():
    # Before: the hook took the checkpoint's tokenizer when the task had none.
    task = captioner()
    with pytest.raises(CheckpointError, match=r"task without a tokenizer; hand it the "
                                              r"checkpoint's first: task.use_tokenizer"):
        task.on_load_checkpoint(_checkpoint(CharTokenizer.train(TEXTS)))
    assert task.tokenizer is None


def test_connect_data_requires_the_same_tokenizer_on_both_sides():
    tokenizer = CharTokenizer.train(TEXTS)
    task = captioner()
    with pytest.raises(UserError, match=r"CaptioningTask has no tokenizer; hand it one first: "
                                        r"task.use_tokenizer\(tokenizer\)"):
        task.connect_data(fake_datamodule())
    task.use_tokenizer(tokenizer)
    with pytest.raises(UserError, match=r"data module has no tokenizer; hand it the task's: "
                                        r"datamodule.connect\(task.tokenizer\)"):
        task.connect_data(fake_datamodule())
    with pytest.raises(UserError, match=r"another tokenizer than the task's"):
        task.connect_data(fake_datamodule(tokenizer=CharTokenizer.train(["xyz"])))
    task.connect_data(fake_datamodule(tokenizer=tokenizer))


def test_a_different_checkpoint_tokenizer_is_refused():
    task = captioner()
    task.use_tokenizer(CharTokenizer.train(TEXTS))
    task.on_load_checkpoint(_checkpoint(CharTokenizer.train(TEXTS)))      # equal: fine
    with pytest.raises(CheckpointError, match=r"checkpoint's tokenizer differs from the one this "
                                              r"task \(and its data\) were given"):
        task.on_load_checkpoint(_checkpoint(CharTokenizer.train(TEXTS + ["xyz"])))


def test_a_checkpoint_without_tokenizer_and_a_too_large_one_are_refused():
    task = captioner()
    task.use_tokenizer(CharTokenizer.train(TEXTS))
    with pytest.raises(CheckpointError, match=r"carries no tokenizer"):
        task.on_load_checkpoint({"mmtf": {"config": {}, "tokenizer": None}})
    with pytest.raises(ConfigError, match=r"the tokenizer has \d+ tokens but "
                                          r"model.decoder.vocab_size is 8"):
        captioner(vocab_size=8).use_tokenizer(CharTokenizer.train(TEXTS))


def test_resolve_takes_a_resumed_checkpoints_tokenizer_and_trains_none(tmp_path, monkeypatch):
    stored = CharTokenizer.train(TEXTS)
    path = tmp_path / "last.ckpt"
    torch.save(_checkpoint(stored), path)
    calls = []
    monkeypatch.setattr("mmtf.text.CharTokenizer.train", lambda *a, **k: calls.append(a))
    got = resolve_tokenizer({"kind": "char"}, train_captions=lambda: calls.append("read"),
                            ckpt_path=path)
    assert got == stored and calls == []         # neither trained nor the captions read
    with pytest.raises(CheckpointError, match=r"carries no tokenizer"):
        torch.save({"mmtf": {"config": {}, "tokenizer": None}}, path)
        resolve_tokenizer({"kind": "char"}, train_captions=list, ckpt_path=path)


def test_resolve_trains_a_fresh_runs_tokenizer_on_the_train_captions_once():
    reads = []

    def captions():
        reads.append(1)
        return TEXTS

    assert resolve_tokenizer({"kind": "char"}, train_captions=captions) == \
        CharTokenizer.train(TEXTS)
    assert reads == [1]
    with pytest.raises(ConfigError, match=r"no tokenizer node; select one with tokenizer=bpe"):
        resolve_tokenizer(None, train_captions=captions)


def test_build_task_hands_the_checkpoint_tokenizer_over(monkeypatch):
    stored = CharTokenizer.train(TEXTS)
    task = captioner()
    checkpoint = {**_checkpoint(stored), "state_dict": task.state_dict()}
    monkeypatch.setattr("mmtf.tasks.rebuild.stored_config", lambda *a: {"model": {}})
    monkeypatch.setattr("mmtf.tasks.rebuild.instantiate", lambda cfg: captioner())
    rebuilt, _ = build_task(checkpoint, "x.ckpt")
    assert rebuilt.tokenizer == stored and rebuilt.model.eos_id == stored.eos_id


class _TwoRanks:
    """A Lightning strategy's two collectives, as rank 1 sees them when rank 0 holds ``rank0``."""

    def __init__(self, rank0):
        self.rank0 = rank0

    def broadcast(self, obj, src=0):
        return hashlib.sha256(self.rank0.to_json_str().encode()).hexdigest()

    def reduce_boolean_decision(self, decision, all=True):
        return decision


def test_ranks_with_different_tokenizers_are_refused():
    mine = CharTokenizer.train(TEXTS)
    check_same_tokenizer_on_every_rank(mine, _TwoRanks(CharTokenizer.train(TEXTS)))  # equal
    with pytest.raises(ConfigError, match=r"DDP ranks resolved different tokenizers"):
        check_same_tokenizer_on_every_rank(mine, _TwoRanks(CharTokenizer.train(["xyz"])))


def test_ids_past_the_tokenizer_vocabulary_are_never_generated():
    # A tokenizer with fewer tokens than the decoder's vocabulary (BPE on little text): make
    # the ids it cannot decode the most likely ones, then caption.
    tokenizer = CharTokenizer.train(TEXTS)
    task = captioner(vocab_size=64, generation={"strategy": "greedy", "max_new_tokens": 6})
    task.use_tokenizer(tokenizer)
    assert task.generation["suppress_tokens"] == tuple(range(tokenizer.vocab_size, 64))
    with torch.no_grad():
        task.model.decoder.lm_head.weight[tokenizer.vocab_size:] *= 1000.0  # tied: also embeds
    task.eval()
    audio, lengths = torch.randn(2, 16000), torch.tensor([16000, 8000])
    raw = task.model.generate(audio, lengths, strategy="greedy", max_new_tokens=6)
    assert int(raw.tokens.max()) >= tokenizer.vocab_size      # control: they would win
    captions = task.generate_captions(audio, lengths)         # decodes: none generated
    tokens = task.model.generate(audio, lengths, **task.generation).tokens
    assert int(tokens.max()) < tokenizer.vocab_size and len(captions) == 2
    task.update_generation({"suppress_tokens": [5]})          # a user's list is kept beside
    assert task.generation["suppress_tokens"] == (5, *range(tokenizer.vocab_size, 64))


def test_the_entry_point_hands_one_object_to_both_and_refuses_a_tokenizer_for_classification():
    received = []
    dm = fake_datamodule(train_captions=lambda: TEXTS, connect=received.append)
    task = captioner()
    connect_tokenizer(OmegaConf.create({"tokenizer": {"kind": "char"}}), task, dm, None)
    assert received == [task.tokenizer] and received[0] is task.tokenizer
    assert task.tokenizer == CharTokenizer.train(TEXTS)
    with pytest.raises(ConfigError, match=r"tokenizer \(kind: bpe\) is set but a "
                                          r"ClassificationTask emits no text; remove it"):
        connect_tokenizer(OmegaConf.create({"tokenizer": {"kind": "bpe"}}), classifier(), dm, None)
    connect_tokenizer(OmegaConf.create({}), classifier(), dm, None)      # none: nothing to do
