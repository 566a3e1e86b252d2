"""The captioning task's tokenizer: taken from checkpoints, checked against the decoder, never
silently swapped once token ids were built with it."""

from __future__ import annotations

import pytest

from mmtf.text import CharTokenizer
from mmtf.utils.checkpoint import CheckpointError
from mmtf.utils.config import ConfigError

from .conftest import captioner, fake_datamodule

TEXTS = ["a high beep", "a low tone then noise"]


def _checkpoint(tokenizer) -> dict:
    return {"mmtf": {"config": {"model": {}}, "tokenizer": tokenizer.to_json_str()}}


def test_the_checkpoint_tokenizer_is_adopted_and_saved_back():
    stored = CharTokenizer.train(TEXTS)
    task = captioner()
    task.on_load_checkpoint(_checkpoint(stored))
    assert task.tokenizer == stored
    saved: dict = {}
    task.on_save_checkpoint(saved)
    assert saved["mmtf"]["tokenizer"] == stored.to_json_str()


def test_connect_data_hands_the_task_tokenizer_to_the_data_module():
    stored = CharTokenizer.train(TEXTS)
    received = []
    task = captioner()
    task.on_load_checkpoint(_checkpoint(stored))
    task.connect_data(fake_datamodule(set_tokenizer=received.append))
    assert received == [stored]


def test_a_different_checkpoint_tokenizer_is_refused_once_one_is_in_use():
    task = captioner()
    task.use_tokenizer(CharTokenizer.train(TEXTS))
    task.on_load_checkpoint(_checkpoint(CharTokenizer.train(TEXTS)))      # equal: fine
    with pytest.raises(CheckpointError, match=r"differs from the one this run already built"):
        task.on_load_checkpoint(_checkpoint(CharTokenizer.train(TEXTS + ["xyz"])))


def test_a_checkpoint_without_tokenizer_and_a_too_large_one_are_refused():
    with pytest.raises(CheckpointError, match=r"carries no tokenizer"):
        captioner().on_load_checkpoint({"mmtf": {"config": {}, "tokenizer": None}})
    with pytest.raises(ConfigError, match=r"the tokenizer has \d+ tokens but "
                                          r"model.decoder.vocab_size is 8"):
        captioner(vocab_size=8).on_load_checkpoint(_checkpoint(CharTokenizer.train(TEXTS)))
