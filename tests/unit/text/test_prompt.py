"""mmtf.text.prompt: every kind of prompt gives the ids written out by hand here, looked up in a
tokenizer the test builds; old config keys of the renamed switches still load."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from mmtf.errors import ConfigError, UserError
from mmtf.text import BPETokenizer, PretrainedTokenizer
from mmtf.text.prompt import Prompt, SourcePrompt, WhisperPrompt, is_whisper, prompt_for
from tests.unit.pretrained.tiny_hf import WHISPER_PROMPT, write_tokenizer


@pytest.fixture()
def whisper(tmp_path):
    hf = write_tokenizer(tmp_path, family="whisper_speech")
    return hf, PretrainedTokenizer.from_folder(tmp_path, prompt=WHISPER_PROMPT)


def test_whisper_prompt_ids_by_hand(whisper):
    hf, tok = whisper
    sot, en, fr, de = (hf.token_to_id(t) for t in ("<|startoftranscript|>", "<|en|>", "<|fr|>",
                                                    "<|de|>"))
    transcribe, translate, none = (hf.token_to_id(t) for t in ("<|transcribe|>", "<|translate|>",
                                                               "<|notimestamps|>"))
    prompt = prompt_for(tok)
    assert isinstance(prompt, WhisperPrompt) and prompt.speech
    assert prompt.default == [sot, en, transcribe, none] == prompt.ids()
    assert prompt.ids(language="fr", job="translate") == [sot, fr, translate, none]
    assert prompt.ids(language="de", timestamps=True) == [sot, de, transcribe]
    assert prompt.build("fr", "translate", timestamps=True) == [sot, fr, translate]
    assert prompt.token_strings() == WHISPER_PROMPT
    with pytest.raises(ConfigError, match=r"a.jsonl line 3: unknown language code 'xx'; the "
                                          r"model's languages are \['de', 'en', 'es'"):
        prompt.ids(language="xx", where="a.jsonl line 3")
    with pytest.raises(UserError, match=r"generation.language='xx' is not a language"):
        prompt.ids(language="xx")


def test_a_configured_prompt_sets_the_default_language_and_timestamps(tmp_path):
    hf = write_tokenizer(tmp_path, family="whisper_speech")
    tok = PretrainedTokenizer.from_folder(tmp_path, prompt=["<|startoftranscript|>", "<|de|>",
                                                            "<|transcribe|>"])
    sot, de, fr = (hf.token_to_id(t) for t in ("<|startoftranscript|>", "<|de|>", "<|fr|>"))
    translate = hf.token_to_id("<|translate|>")
    prompt = WhisperPrompt(tok)
    assert prompt.default_language() == "de"
    assert prompt.ids(job="translate") == [sot, de, translate]          # no <|notimestamps|>
    assert prompt.ids(language="fr", timestamps=False)[-1] == hf.token_to_id("<|notimestamps|>")
    assert prompt.ids(language="fr")[:2] == [sot, fr]


def test_english_only_models_prompt_with_start_and_no_timestamps(tmp_path):
    hf = write_tokenizer(tmp_path, family="whisper_speech")
    (tmp_path / "generation_config.json").write_text(json.dumps({"is_multilingual": False}))
    tok = PretrainedTokenizer.from_folder(tmp_path)
    prompt = WhisperPrompt(tok)
    assert prompt.token_strings() == ["<|startoftranscript|>", "<|notimestamps|>"]
    assert prompt.default_language() is None
    assert prompt.build(None, timestamps=True) == [hf.token_to_id("<|startoftranscript|>")]


def test_fixed_and_source_prompts():
    tok = BPETokenizer.train(["a dog barks", "rain falls"] * 4, vocab_size=60,
                             special_tokens=["<src_a>", "<src_b>"], prompt=["<bos>", "<src_a>"])
    a, b = tok.token_to_id("<src_a>"), tok.token_to_id("<src_b>")
    fixed = prompt_for(tok)
    assert type(fixed) is Prompt and not is_whisper(tok) and not fixed.speech
    assert fixed.default == [1, a] == fixed.ids(language="fr", job="translate")
    mixed = SourcePrompt(fixed, {"a": a, "b": b})
    assert mixed.ids(source="b") == [1, b] and mixed.ids(source="c") == [1, a]
    assert mixed.mark([1, a, 7, 8, 2], "b") == [1, b, 7, 8, 2]
    assert fixed.start([[1, a, 7, 2], [1, a, 2]], [1, b]) == [[1, b, 7, 2], [1, b, 2]]
    with pytest.raises(ConfigError, match=r"x.tsv: the item's prompt \['<bos>'\] is not as long "
                                          r"as tokenizer.prompt \['<bos>', '<src_a>'\]"):
        fixed.start([[1, a, 2]], [1], where="x.tsv")


def test_speech_keys_are_the_speech_options():
    from mmtf.tasks.captioning import SPEECH_KEYS
    from mmtf.tasks.speech import SpeechOptions

    assert {f.name for f in dataclasses.fields(SpeechOptions)} == SPEECH_KEYS


def test_old_flat_finetuning_keys_move_under_finetuning():
    from mmtf.tasks.captioning import upgrade_config

    old = {"_target_": "mmtf.tasks.CaptioningTask", "freeze_decoder": True, "layer_decay": 0.8,
           "weight_decay": 0.05}
    assert upgrade_config(old) == {"_target_": "mmtf.tasks.CaptioningTask", "weight_decay": 0.05,
                                   "finetuning": {"freeze_decoder": True, "layer_decay": 0.8}}


def test_data_task_is_read_as_speech_job_with_one_warning(tmp_path, caplog):
    from mmtf.data.datamodule import CaptionDataModule

    common = {"format": "manifest", "root": str(tmp_path), "modality": "audio"}
    with caplog.at_level(logging.WARNING, logger="mmtf.data"):
        dm = CaptionDataModule(task="translate", **common)
    assert dm.speech_job == "translate" and dm.targets == "caption"
    assert [r.getMessage() for r in caplog.records] == [
        "[data] data.task is now data.speech_job; read data.task=translate as it"]
    with pytest.raises(ConfigError, match=r"data.task \('translate'\) is the old name of "
                                          r"data.speech_job \('transcribe'\)"):
        CaptionDataModule(task="translate", speech_job="transcribe", **common)
    with pytest.raises(ConfigError, match=r"data.speech_job \('summarize'\) must be one of"):
        CaptionDataModule(speech_job="summarize", **common)
