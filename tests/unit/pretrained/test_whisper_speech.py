"""Whisper's speech decoding (mmtf.decoders.speech) equals transformers' Whisper ``generate``.

A tiny random-weight ``WhisperForConditionalGeneration`` with Whisper's full special layout (8
languages, 1501 timestamp tokens; tests/unit/pretrained/tiny_hf.py), saved with
``save_pretrained`` and imported by mmtf. Compared, float32, greedy:

* the detected language against ``detect_language`` on inputs that detect different languages;
* the timestamp rules against ``WhisperTimeStampLogitsProcessor`` on random logits and token
  histories (every branch: pairs, single timestamps, the first step, the probability rule);
* tokens and segments of short clips against ``generate(return_timestamps=True)``;
* a 150 s clip against transformers' sequential long-form ``generate`` (temperature 0, no
  conditioning on previous text), with windows that moved by a timestamp (not by 30 s).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mmtf.decoders import EncoderDecoder, GenerationConfig
from mmtf.decoders.speech import (
    PLAIN,
    TimedSegment,
    TimestampRules,
    detect_language,
    merge_overlapping,
    transcribe_long,
    window_segments,
)
from mmtf.pretrained.whisper import whisper_decoder, whisper_encoder
from mmtf.text import PretrainedTokenizer
from mmtf.text.prompt import WhisperPrompt
from tests.unit.pretrained.tiny_hf import padded_batch, speech_whisper, whisper_bans, write_whisper

transformers = pytest.importorskip("transformers")

SR = 16000
MAX_NEW = 40
ONE_PASS = dataclasses.replace(PLAIN, sample_len=MAX_NEW)     # transformers' max_new_tokens


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """(HF model, mmtf EncoderDecoder, tokenizer) of a tiny random multilingual Whisper."""
    return speech_whisper(tmp_path_factory.mktemp("whisper_speech"))


def scene(seconds: float, seed: int) -> np.ndarray:
    from mmtf.synthetic.audio import render, sample_scene

    rng = np.random.default_rng(seed)
    clip = sample_scene(rng, min_seconds=min(seconds, 10.0), max_seconds=min(seconds, 10.0))
    parts, n = [], int(seconds * SR)
    while sum(len(p) for p in parts) < n:
        parts.append(render(clip, SR, rng).astype(np.float32))
    return np.concatenate(parts)[:n]


def varied_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    t = np.arange(3 * SR) / SR
    return [scene(2.3, 0), (0.1 * rng.standard_normal(5 * SR)).astype(np.float32),
            rng.standard_normal(5 * SR).astype(np.float32),
            (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), scene(7.1, 2)]


def hf_features(waves, **options) -> dict:
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    return extractor(waves, sampling_rate=SR, return_tensors="pt", **options)


def hf_segments(segments: list[dict]) -> list[tuple[float, float, list[int]]]:
    return [(float(s["start"]), float(s["end"]), s["tokens"].tolist()) for s in segments]


def ours(segments: list[TimedSegment]) -> list[tuple[float, float, list[int]]]:
    return [(s.start, s.end, s.tokens) for s in segments]


def assert_same_segments(mine, theirs) -> None:
    assert [s[2] for s in mine] == [s[2] for s in theirs]
    np.testing.assert_allclose([s[:2] for s in mine], [s[:2] for s in theirs], atol=1e-9)


@torch.no_grad()
def test_detected_language_equals_transformers_detect_language(speech):
    hf, model, tokenizer = speech
    waves = varied_inputs()
    expected = hf.detect_language(hf_features(waves).input_features)
    memory, mask = model.encode(*padded_batch(waves))
    found = detect_language(model.decoder, memory, mask,
                            start_id=tokenizer.start_of_transcript_id,
                            language_ids=list(tokenizer.languages.values()))
    assert found.tolist() == expected.tolist()
    assert len(set(found.tolist())) >= 2           # the inputs do detect different languages


def test_timestamp_rules_equal_whisper_timestamp_logits_processor(speech):
    hf, _, tokenizer = speech
    tb, eos, vocab = tokenizer.timestamp_begin, tokenizer.eos_id, tokenizer.vocab_size
    prompt = WhisperPrompt(tokenizer).build("en", timestamps=True)
    theirs = transformers.WhisperTimeStampLogitsProcessor(hf.generation_config,
                                                          begin_index=len(prompt))
    rules = TimestampRules(timestamp_begin=tb, no_timestamps_id=tokenizer.no_timestamps_id,
                           eos_id=eos)
    g = torch.Generator().manual_seed(0)
    text = lambda: int(torch.randint(0, eos, (1,), generator=g))          # noqa: E731
    stamp = lambda k: tb + k                                               # noqa: E731
    histories = [[], [stamp(0)], [stamp(3), text()], [stamp(3), text(), stamp(9)],
                 [stamp(3), text(), stamp(9), stamp(9)], [stamp(0), text(), text()],
                 [stamp(5), text(), stamp(40), stamp(41), text(), text(), stamp(60)]]
    for scale in (1.0, 6.0):           # 6: peaked logits, so the probability rule varies
        for history in histories:
            logits = torch.randn(3, vocab, generator=g) * scale
            logits[1, tb:] += 4.0      # one row where the timestamps carry most of the mass
            generated = torch.tensor([history] * 3, dtype=torch.long).view(3, len(history))
            expected = theirs(torch.cat([torch.tensor([prompt] * 3), generated], dim=1), logits)
            mine = logits.clone()
            rules(mine, generated)
            assert torch.equal(torch.isinf(mine), torch.isinf(expected)), history
            torch.testing.assert_close(mine, expected)


@pytest.mark.slow
def test_short_clips_with_timestamps_equal_transformers_generate(speech):
    hf, model, tokenizer = speech
    waves = [scene(2.3, 0), scene(12.0, 3)]
    prompt = WhisperPrompt(tokenizer).build("en", timestamps=True)
    out = hf.generate(hf_features(waves).input_features, return_timestamps=True,
                      return_segments=True, language="en", task="transcribe",
                      max_new_tokens=MAX_NEW,
                      suppress_tokens=whisper_bans(tokenizer.no_timestamps_id, prompt, prev=False),
                      begin_suppress_tokens=None)
    x, lengths = padded_batch(waves)
    features, _ = model.encoder.frontend(x, lengths)                           # (b, f, 3000)
    rules = TimestampRules(timestamp_begin=tokenizer.timestamp_begin,
                           no_timestamps_id=tokenizer.no_timestamps_id, eos_id=tokenizer.eos_id)
    config = GenerationConfig(max_new_tokens=MAX_NEW)
    stamped = 0
    for i in range(len(waves)):
        mine = ours(transcribe_long(model, features[i], prompt=prompt, config=config,
                                    rules=rules, options=ONE_PASS, frames=len(waves[i]) // 160))
        assert_same_segments(mine, hf_segments(out["segments"][i]))
        stamped += sum(t >= tokenizer.timestamp_begin for s in mine for t in s[2])
    assert stamped > 0


@pytest.mark.slow
def test_english_only_model_prompts_with_start_of_transcript_alone_as_transformers(
        tmp_path):
    hf = write_whisper(tmp_path, speech=True, multilingual=False, max_target_positions=64,
                       seed=1)
    tokenizer = PretrainedTokenizer.from_folder(tmp_path)
    model = EncoderDecoder(encoder=whisper_encoder(pretrained=tmp_path),
                           decoder=whisper_decoder(pretrained=tmp_path),
                           pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id,
                           prompt_ids=WhisperPrompt(tokenizer).build(None)).eval()
    prompt = WhisperPrompt(tokenizer).build(None, timestamps=True)
    assert prompt == [tokenizer.start_of_transcript_id]
    waves = [scene(5.0, 4)]
    out = hf.generate(hf_features(waves).input_features, return_timestamps=True,
                      return_segments=True, max_new_tokens=MAX_NEW,
                      suppress_tokens=whisper_bans(tokenizer.no_timestamps_id, prompt, prev=False),
                      begin_suppress_tokens=None)
    features, _ = model.encoder.frontend(*padded_batch(waves))
    rules = TimestampRules(timestamp_begin=tokenizer.timestamp_begin,
                           no_timestamps_id=tokenizer.no_timestamps_id, eos_id=tokenizer.eos_id)
    mine = ours(transcribe_long(model, features[0], prompt=prompt,
                                config=GenerationConfig(max_new_tokens=MAX_NEW), rules=rules,
                                options=ONE_PASS))
    assert_same_segments(mine, hf_segments(out["segments"][0]))
    # A timestamp first (the rules' first step), then text: the prompt and rules were read.
    tokens = [t for s in mine for t in s[2]]
    assert tokens[0] >= tokenizer.timestamp_begin and len(tokens) > 1


@pytest.mark.slow
def test_long_form_equals_transformers_sequential_long_form_generate(speech):
    hf, model, tokenizer = speech
    wave = scene(150.0, 5)
    prompt = WhisperPrompt(tokenizer).build("en", timestamps=True)
    features = hf_features(wave, truncation=False, padding="longest",
                           return_attention_mask=True)
    out = hf.generate(features.input_features, attention_mask=features.attention_mask,
                      return_timestamps=True, return_segments=True, language="en",
                      task="transcribe", max_new_tokens=MAX_NEW, temperature=0.0,
                      condition_on_prev_tokens=False,
                      suppress_tokens=whisper_bans(tokenizer.no_timestamps_id, prompt, prev=False),
                      begin_suppress_tokens=None)
    expected = hf_segments(out["segments"][0])
    mine_features = model.encoder.whisper_features(torch.from_numpy(wave))     # (f, 15000)
    torch.testing.assert_close(mine_features, features.input_features[0], atol=1e-4, rtol=0)
    rules = TimestampRules(timestamp_begin=tokenizer.timestamp_begin,
                           no_timestamps_id=tokenizer.no_timestamps_id, eos_id=tokenizer.eos_id)
    mine = ours(transcribe_long(model, mine_features, prompt=prompt,
                                config=GenerationConfig(max_new_tokens=MAX_NEW), rules=rules,
                                options=ONE_PASS))
    assert_same_segments(mine, expected)
    # Meaningful: several windows, and at least one moved by a timestamp rather than by 30 s
    # (a window start that is not a multiple of 30 s).
    starts = sorted({round(s[0] - (s[2][0] - tokenizer.timestamp_begin) * 0.02, 2)
                     for s in mine})
    assert len(starts) >= 5 and any(abs(a / 30 - round(a / 30)) > 1e-6 for a in starts)


def test_window_segments_follow_whisper_on_hand_made_windows():
    tb = 100
    # A pair closes the first segment; the window ends with a single timestamp: 2 segments,
    # move by the whole window.
    segments, advance = window_segments([tb, 1, 2, tb + 50, tb + 50, 3, tb + 80], timestamp_begin=tb,
                                        offset=10.0, window_frames=3000)
    assert [(s.start, s.end, s.tokens) for s in segments] == [
        (10.0, 11.0, [tb, 1, 2, tb + 50]), (11.0, 11.6, [tb + 50, 3, tb + 80])]
    assert advance == 3000
    # Text after the last pair was cut by max_new_tokens: move to that pair (frame 2 * 50).
    segments, advance = window_segments([tb, 1, tb + 50, tb + 50, 3, 4], timestamp_begin=tb,
                                        offset=0.0, window_frames=3000)
    assert [(s.start, s.end) for s in segments] == [(0.0, 1.0)] and advance == 100
    # No pair: one segment to the last timestamp, the whole window consumed.
    segments, advance = window_segments([tb + 10, 5, 6], timestamp_begin=tb, offset=0.0,
                                        window_frames=1000)
    assert [(s.start, s.end) for s in segments] == [(0.0, 0.2)] and advance == 1000
    segments, _ = window_segments([5, 6], timestamp_begin=tb, offset=30.0, window_frames=1000)
    assert [(s.start, s.end) for s in segments] == [(30.0, 40.0)]


def test_merge_overlapping_cuts_at_the_middle_of_the_longest_common_run():
    a = [1, 2, 3, 4, 5, 6, 7]
    b = [4, 5, 6, 7, 8, 9]                # overlap 4 5 6 7: a up to 4 5, b from 6 on
    assert merge_overlapping([a, b]) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # The chunks disagree at the edges (a cut word): the common run decides, the edges go.
    a = [1, 2, 3, 4, 5, 99]
    b = [77, 3, 4, 5, 6]
    assert merge_overlapping([a, b]) == [1, 2, 3, 4, 5, 6]
    assert merge_overlapping([[1, 2], [3, 4], [4, 5]]) == [1, 2, 3, 4, 5]
    assert merge_overlapping([[1, 2, 9], [9, 3]], max_overlap=1) == [1, 2, 9, 3]
