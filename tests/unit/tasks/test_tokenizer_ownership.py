"""The captioning task's tokenizer: taken from checkpoints, checked against the decoder, never
silently swapped once token ids were built with it."""

from __future__ import annotations

import pytest
import torch

from mmtf.errors import CheckpointError, ConfigError
from mmtf.text import CharTokenizer

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
