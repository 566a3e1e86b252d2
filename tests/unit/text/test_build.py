"""build_tokenizer: one tokenizer per kind of the ``tokenizer`` config node, training only the
kinds that train, and one-line errors naming the key."""

from __future__ import annotations

import pytest

from mmtf.errors import ConfigError, UserError
from mmtf.text import BPETokenizer, CharTokenizer, PretrainedTokenizer, build_tokenizer, trains
from tests.unit.pretrained.tiny_hf import WHISPER_PROMPT, write_tokenizer

TEXTS = ["a high beep", "a low tone"] * 5


def _texts():
    return TEXTS


def _never():
    raise AssertionError("the training captions were read for a kind that does not train")


def test_trained_kinds_equal_their_class_trained_directly():
    char = build_tokenizer({"kind": "char"}, _texts)
    assert char == CharTokenizer.train(TEXTS) and char.decode(char.encode("a beep")) == "a beep"
    bpe = build_tokenizer({"kind": "bpe", "vocab_size": 40}, _texts)
    assert bpe == BPETokenizer.train(TEXTS, vocab_size=40) and bpe.vocab_size <= 40
    assert build_tokenizer({"vocab_size": 40}, _texts) == bpe          # kind defaults to bpe
    assert trains({"kind": "bpe"}) and trains({"kind": "char"}) and trains({})
    assert not trains({"kind": "pretrained"}) and not trains({"kind": "saved"})


def test_saved_and_pretrained_are_read_never_trained(tmp_path):
    saved = tmp_path / "tok.json"
    char = CharTokenizer.train(TEXTS)
    char.save(saved)
    assert build_tokenizer({"kind": "saved", "path": str(saved)}, _never) == char
    folder = tmp_path / "whisper"
    write_tokenizer(folder, family="whisper")
    # A training option inherited from an experiment (its decoder size) is not an error.
    tok = build_tokenizer({"kind": "pretrained", "path": str(folder), "prompt": WHISPER_PROMPT,
                           "vocab_size": 256}, _never)
    assert tok == PretrainedTokenizer.from_folder(folder, prompt=WHISPER_PROMPT)


def test_errors_name_the_key_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"tokenizer.kind \('wordpiece'\) must be one of"):
        build_tokenizer({"kind": "wordpiece"}, _texts)
    with pytest.raises(ConfigError, match=r"rejected the options \['vocab_sise'\]"):
        build_tokenizer({"kind": "bpe", "vocab_sise": 10}, _texts)
    with pytest.raises(ConfigError, match=r"tokenizer.kind=bpe trains on the train split"):
        build_tokenizer({"kind": "bpe"})
    with pytest.raises(ConfigError, match=r"tokenizer.path is None \(kind: pretrained\); set "
                                          r"pretrained=<model folder or hub id>"):
        build_tokenizer({"kind": "pretrained", "path": None}, _never)
    with pytest.raises(ConfigError, match=r"\(kind: saved\) takes \['path'\]; got \['prompt'\]"):
        build_tokenizer({"kind": "saved", "path": "x.json", "prompt": ["a"]}, _never)
    with pytest.raises(UserError, match=r"missing.json"):
        build_tokenizer({"kind": "saved", "path": str(tmp_path / "missing.json")}, _never)
