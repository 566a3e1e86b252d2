"""Whisper's window rules (mmtf.decoders.speech.transcribe_long, SpeechTask) against
transformers' Whisper ``generate`` and openai's ``transcribe`` rules, on tiny random Whisper
folders (tests/unit/pretrained/tiny_hf.py): the window budget and seek (defect 3), short clips
decoded up to the audio's end only (defect 4), timestamps on a folder whose tokenizer lacks the
timestamp strings (defect 12), conditioning on earlier text, the initial prompt, temperature
fallback on a repetition loop, and the no-speech rule on silence and noise.

Comparisons with transformers are greedy at temperature 0, where both are deterministic:
transformers samples with its own random stream at temperature > 0, and computes the
compression ratio on token ids (openai and mmtf: on the text), so fallback is tested here
against openai's rules on controlled inputs instead.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import mmtf
import mmtf.decoders.speech as speech_module
from mmtf.decoders import EncoderDecoder, GenerationConfig
from mmtf.decoders.speech import TimestampRules, WindowRules, transcribe_long
from mmtf.pretrained.whisper import whisper_decoder, whisper_encoder
from mmtf.text import PretrainedTokenizer
from mmtf.text.prompt import WhisperPrompt
from tests.unit.pretrained.test_whisper_speech import (
    assert_same_segments,
    hf_features,
    hf_segments,
    ours,
    scene,
)
from tests.unit.pretrained.tiny_hf import whisper_bans, write_whisper

transformers = pytest.importorskip("transformers")

SR = 16000
# openai's transcribe with one temperature (nothing sampled): thresholds and context as openai.
GREEDY = WindowRules(temperatures=(0.0,))
OFF = dict(temperatures=[0.0], compression_ratio_threshold=None, logprob_threshold=None,
           no_speech_threshold=None, condition_on_previous_text=False)


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """(folder, HF model, mmtf EncoderDecoder, tokenizer), 64 decoder positions."""
    folder = tmp_path_factory.mktemp("whisper_windows")
    hf = write_whisper(folder, speech=True, max_target_positions=64)
    tokenizer = PretrainedTokenizer.from_folder(folder)
    model = EncoderDecoder(encoder=whisper_encoder(pretrained=folder),
                           decoder=whisper_decoder(pretrained=folder), pad_id=tokenizer.pad_id,
                           eos_id=tokenizer.eos_id,
                           prompt_ids=WhisperPrompt(tokenizer).build("en")).eval()
    return folder, hf, model, tokenizer


def rules_of(tokenizer) -> TimestampRules:
    return TimestampRules(timestamp_begin=tokenizer.timestamp_begin,
                          no_timestamps_id=tokenizer.no_timestamps_id, eos_id=tokenizer.eos_id)


def hf_long(hf, wave, prompt, prev=False, **options):
    features = hf_features(wave, truncation=False, padding="longest", return_attention_mask=True)
    out = hf.generate(features.input_features, attention_mask=features.attention_mask,
                      return_timestamps=True, return_segments=True, language="en",
                      task="transcribe",
                      suppress_tokens=whisper_bans(hf.generation_config.no_timestamps_token_id,
                                                   prompt, prev=prev),
                      begin_suppress_tokens=None, **options)
    return hf_segments(out["segments"][0])


@torch.no_grad()
def test_long_form_windows_use_whispers_budget_not_the_tasks_max_new_tokens(whisper):
    """Defect 3: with the task's max_new_tokens (8 here; 30 in conf/model/whisper.yaml) a
    window without a timestamp pair in it was taken as done; openai decodes n_ctx // 2 tokens
    per window (32 for 64 positions) and seeks to the last pair."""
    _, hf, model, tokenizer = whisper
    wave = scene(70.0, 5)
    prompt = WhisperPrompt(tokenizer).build("en", timestamps=True)
    expected = hf_long(hf, wave, prompt, max_new_tokens=32, temperature=0.0,
                       condition_on_prev_tokens=False)
    mine = ours(transcribe_long(model, model.encoder.whisper_features(torch.from_numpy(wave)),
                                prompt=prompt, config=GenerationConfig(max_new_tokens=8),
                                rules=rules_of(tokenizer)))
    assert_same_segments(mine, expected)


def scripted_generate(tokens_of):
    """A stand-in for ``generate`` in mmtf.decoders.speech: each call returns
    ``tokens_of(call index)`` + eos with log-probability 0, and is counted."""
    from mmtf.decoders.generation import GenerationOutput

    calls = []

    def fake(decoder, memory, mask, config, *, eos_id, **kwargs):
        row = [*tokens_of(len(calls)), eos_id]
        calls.append(config)
        return GenerationOutput(torch.tensor([row]), torch.zeros(1), torch.tensor([len(row)]))

    return fake, calls


@torch.no_grad()
def test_short_clips_with_timestamps_stop_at_the_audios_end(whisper, monkeypatch):
    """Defect 4: a 2.3 s clip's features are padded to 30 s; after each window that ends in a
    timestamp pair and cut-off text the loop went on decoding the padding up to 30 s."""
    folder, _, _, tokenizer = whisper
    tb = tokenizer.timestamp_begin
    # Every window: a segment from 0 to 1 s closed by a pair, then text cut off: seek 1 s.
    fake, calls = scripted_generate(lambda _: [tb, 300, tb + 50, tb + 50, 301, 302])
    monkeypatch.setattr(speech_module, "generate", fake)
    model, _ = mmtf.load(str(folder))
    (row,) = model.transcribe([scene(2.3, 0)], language="en", timestamps=True)
    assert [(s["start"], s["end"]) for s in row["segments"]] == [(0.0, 1.0), (1.0, 2.0),
                                                                  (2.0, 2.3)]
    assert len(calls) == 3          # windows at 0, 1 and 2 s; none in the padding


@pytest.fixture(scope="module")
def stripped(tmp_path_factory):
    """A Whisper folder whose tokenizer.json lacks <|0.00|> .. <|30.00|> (older hub revisions,
    CTranslate2 conversions); the model keeps the rows."""
    folder = tmp_path_factory.mktemp("whisper_no_timestamp_strings")
    hf = write_whisper(folder, speech=True, max_target_positions=64, seed=2)
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    data["added_tokens"] = [t for t in data["added_tokens"]
                            if not (t["content"].startswith("<|") and t["content"][2].isdigit())]
    path.write_text(json.dumps(data))
    return folder, hf


@torch.no_grad()
def test_timestamps_on_a_tokenizer_without_timestamp_strings_equal_transformers(stripped):
    """Defect 12: the first timestamp id is <|notimestamps|> + 1, as openai and transformers
    take it; times come from the ids, text from the text ids."""
    folder, hf = stripped
    tokenizer = PretrainedTokenizer.from_folder(folder)
    assert tokenizer.backend.token_to_id("<|0.00|>") is None
    model, _ = mmtf.load(str(folder))
    wave = scene(6.0, 4)
    (row,) = model.transcribe([wave], language="en", timestamps=True, **OFF)
    prompt = WhisperPrompt(tokenizer).build("en", timestamps=True)
    out = hf.generate(hf_features([wave]).input_features, return_timestamps=True,
                      return_segments=True, language="en", task="transcribe",
                      max_new_tokens=32,
                      suppress_tokens=whisper_bans(tokenizer.no_timestamps_id, prompt),
                      begin_suppress_tokens=None)
    expected = hf_segments(out["segments"][0])
    tb = hf.generation_config.no_timestamps_token_id + 1
    assert any(t >= tb for *_, ts in expected for t in ts)     # ids past the strings
    assert [s["text"] for s in row["segments"]] == [
        tokenizer.decode([t for t in ts if t < tb]) for *_, ts in expected]
    np.testing.assert_allclose([(s["start"], s["end"]) for s in row["segments"]],
                               [(min(a, 6.0), min(z, 6.0)) for a, z, _ in expected], atol=1e-6)
