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

import dataclasses
import json

import numpy as np
import pytest
import torch

import mmtf
import mmtf.decoders.speech as speech_module
from mmtf.decoders import GenerationConfig
from mmtf.decoders.speech import PLAIN, TimestampRules, WindowRules, transcribe_long
from mmtf.text import PretrainedTokenizer
from mmtf.text.prompt import WhisperPrompt
from tests.unit.pretrained.test_whisper_speech import (
    assert_same_segments,
    hf_features,
    hf_segments,
    ours,
    scene,
)
from tests.unit.pretrained.tiny_hf import (
    import_whisper,
    speech_whisper,
    whisper_bans,
    write_whisper,
)

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
    return folder, *speech_whisper(folder)


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
    ``tokens_of(config)`` + eos with log-probability 0, and is recorded (config, prompt)."""
    from mmtf.decoders.generation import GenerationOutput

    calls = []

    def fake(decoder, memory, mask, config, *, eos_id, prompt_ids, **kwargs):
        row = [*tokens_of(config), eos_id]
        calls.append((config, list(prompt_ids)))
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


@torch.no_grad()
def test_long_form_with_context_and_thresholds_equals_transformers(whisper):
    """openai's rules at one temperature (deterministic on both sides): the text so far as the
    <|startofprev|> prompt, the compression-ratio / log-prob / no-speech thresholds; equal to
    transformers' long-form generate with the same options; times non-decreasing, in the audio.
    24 tokens per window keep transformers' budget fixed (it lowers max_new_tokens for good
    once a long prompt leaves less room)."""
    _, hf, model, tokenizer = whisper
    wave = scene(95.0, 6)
    prompt = WhisperPrompt(tokenizer).build("en", timestamps=True)
    prev = tokenizer.backend.token_to_id("<|startofprev|>")
    hf.generation_config.prev_sot_token_id = prev
    expected = hf_long(hf, wave, prompt, prev=True, max_new_tokens=24, temperature=(0.0,),
                       condition_on_prev_tokens=True, compression_ratio_threshold=2.4,
                       logprob_threshold=-1.0, no_speech_threshold=0.6)
    options = dataclasses.replace(GREEDY, sample_len=24)
    found = transcribe_long(model, model.encoder.whisper_features(torch.from_numpy(wave)),
                            prompt=prompt, config=GenerationConfig(), rules=rules_of(tokenizer),
                            options=options, prev_id=prev, text=tokenizer.decode)
    assert_same_segments(ours(found), expected)
    times = [t for s in found for t in (s.start, s.end)]
    assert times == sorted(times) and times[0] >= 0 and times[-1] <= 95.0
    assert len(found) >= 3 and {"avg_logprob", "no_speech_prob", "compression_ratio",
                                "temperature"} <= set(found[0].stats)
    # The context was used: without it the windows decode otherwise.
    plain = transcribe_long(model, model.encoder.whisper_features(torch.from_numpy(wave)),
                            prompt=prompt, config=GenerationConfig(), rules=rules_of(tokenizer),
                            options=dataclasses.replace(options, condition_on_previous_text=False),
                            prev_id=prev, text=tokenizer.decode)
    assert ours(plain) != ours(found)


@torch.no_grad()
def test_initial_prompt_equals_transformers_prompt_ids(whisper):
    _, hf, model, tokenizer = whisper
    wave = scene(8.0, 7)
    prompt = WhisperPrompt(tokenizer).build("en", timestamps=True)
    prev = tokenizer.backend.token_to_id("<|startofprev|>")
    initial = tokenizer.backend.encode(" a dog barks at the cat").ids
    out = hf.generate(hf_features([wave]).input_features, return_timestamps=True,
                      return_segments=True, language="en", task="transcribe",
                      max_new_tokens=24, prompt_ids=torch.tensor([prev, *initial]),
                      suppress_tokens=whisper_bans(tokenizer.no_timestamps_id, prompt),
                      begin_suppress_tokens=None)
    features, _ = model.encoder.frontend(torch.from_numpy(wave)[None], torch.tensor([len(wave)]))
    found = transcribe_long(model, features[0], prompt=prompt, config=GenerationConfig(),
                            rules=rules_of(tokenizer), prev_id=prev, initial_prompt=initial,
                            options=dataclasses.replace(PLAIN, sample_len=24))
    expected = hf_segments(out["segments"][0])
    assert [s.tokens for s in found][:1] == [e[2] for e in expected][:1]
    without = transcribe_long(model, features[0], prompt=prompt, config=GenerationConfig(),
                              rules=rules_of(tokenizer), prev_id=prev,
                              options=dataclasses.replace(PLAIN, sample_len=24))
    assert [s.tokens for s in without] != [s.tokens for s in found]


def loop_then_text(tb: int, loops_below: float):
    """Scripted windows: a repetition loop at temperatures below ``loops_below``, else a short
    text; each window ends in a single timestamp (the next starts 30 s on)."""
    def tokens_of(config) -> list[int]:
        hot = config.strategy == "sample" and config.temperature >= loops_below
        return [tb, 290, 284, tb + 50] if hot else [tb, *([265, 266] * 12), tb + 1000]
    return tokens_of


def test_temperature_fallback_cuts_a_repetition_loop_and_resets_the_context(whisper,
                                                                            monkeypatch):
    """openai's rules: a window whose text compresses more than 2.4 times is decoded again at
    the next temperature; the kept window records it; after a window kept above 0.5 the next
    window's prompt holds no earlier text; below it, it does."""
    _, _, model, tokenizer = whisper
    tb, prev = tokenizer.timestamp_begin, tokenizer.backend.token_to_id("<|startofprev|>")
    prompt = WhisperPrompt(tokenizer).build("en", timestamps=True)
    features = torch.zeros(80, 6000)                               # two 30 s windows
    for loops_below, context in ((0.2, True), (0.6, False)):
        fake, seen = scripted_generate(loop_then_text(tb, loops_below))
        monkeypatch.setattr(speech_module, "generate", fake)
        found = transcribe_long(model, features, prompt=prompt, config=GenerationConfig(),
                                rules=rules_of(tokenizer), options=WindowRules(),
                                prev_id=prev, text=tokenizer.decode)
        assert [s.tokens for s in found] == [[tb, 290, 284, tb + 50]] * 2
        assert {s.stats["temperature"] for s in found} == {loops_below}
        assert all(s.stats["compression_ratio"] < 2.4 for s in found)
        # The loop was tried and failed first: greedy, then 0.2, ... up to loops_below.
        tried = [0.0 if c.strategy != "sample" else c.temperature for c, _ in seen]
        steps = round(loops_below / 0.2) + 1
        assert tried == [round(0.2 * k, 1) for k in range(steps)] * 2
        second = seen[steps][1]
        assert (second[:4] == [prev, tb, 290, 284]) is context
        assert second[-len(prompt):] == prompt


def speech_and_silence() -> np.ndarray:
    """90 s: 35 s of sound, 20 s of silence, 35 s of sound."""
    return np.concatenate([scene(35.0, 8), np.zeros(20 * SR, np.float32), scene(35.0, 9)])


def quiet_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"silence": np.zeros(20 * SR, np.float32),
            "noise": (0.3 * rng.standard_normal(20 * SR)).astype(np.float32)}


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """(folder, model, tokenizer) of a random Whisper shaped to detect silence and noise.

    A random model's <|nospeech|> probability means nothing, so its output row (tied to the
    embedding, and never generated: it is banned) is set by least squares on the decoder's
    hidden state at <|startoftranscript|>: about 0.9 on the silence and noise clips and on the
    window of the 90 s file that starts at 30 s (20 of its 30 s silent), about 0.05 on the
    windows at 0 and 60 s. The folder bans the special ids, so the model writes text."""
    folder = tmp_path_factory.mktemp("whisper_detector")
    hf = write_whisper(folder, speech=True, max_target_positions=64)
    generation = hf.generation_config
    no_speech = generation.no_timestamps_token_id - 1
    eos = generation.eos_token_id
    generation.suppress_tokens = list(range(eos + 1, generation.no_timestamps_token_id + 1))
    long = hf_features(speech_and_silence(), truncation=False, padding="longest")
    windows = [long.input_features[..., k:k + 3000] for k in (0, 3000, 6000)]
    windows += [hf_features([w]).input_features for w in quiet_inputs().values()]
    silent = torch.tensor([False, True, False, True, True])
    with torch.no_grad():
        start = torch.full((1, 1), generation.decoder_start_token_id)
        hidden = torch.cat([hf.model(input_features=f, decoder_input_ids=start)
                            .last_hidden_state[:, -1] for f in windows])          # (5, d)
        rows = hf.model.decoder.embed_tokens.weight
        others = torch.cat([rows[:no_speech], rows[no_speech + 1:]])
        rest = (hidden @ others.T).logsumexp(dim=-1)                                 # (5,)
        target = rest + torch.where(silent, 2.0, -3.0)
        rows[no_speech] = torch.linalg.lstsq(hidden, target[:, None]).solution[:, 0]
    hf.save_pretrained(folder)
    return (folder, *import_whisper(folder))


@torch.no_grad()
def test_a_silent_stretch_of_a_long_file_gets_no_text(detector):
    """The window at 30 s is silence by the no-speech rule (probability > 0.6 and average
    log-probability < -1): skipped, so no text lies in 35-55 s; with the rule off the same
    window writes text there. Greedy at one temperature, no context: the windows are fixed."""
    _, model, tokenizer = detector
    features = model.encoder.whisper_features(torch.from_numpy(speech_and_silence()))
    config = GenerationConfig(suppress_tokens=tuple(range(tokenizer.eos_id + 1,
                                                          tokenizer.timestamp_begin)))
    runs = {}
    for threshold in (0.6, None):
        options = WindowRules(temperatures=(0.0,), condition_on_previous_text=False,
                              no_speech_threshold=threshold)
        runs[threshold] = transcribe_long(model, features, prompt=WhisperPrompt(tokenizer).build(
            "en", timestamps=True), config=config, rules=rules_of(tokenizer), options=options,
            text=tokenizer.decode)
    in_silence = {k: [s for s in found if s.start < 55.0 and s.end > 35.0
                      and tokenizer.decode([t for t in s.tokens if t < tokenizer.timestamp_begin])]
                  for k, found in runs.items()}
    assert in_silence[None] and not in_silence[0.6]
    assert runs[0.6] and all(s.stats["no_speech_prob"] < 0.6 for s in runs[0.6])
    times = [t for s in runs[0.6] for t in (s.start, s.end)]
    assert times == sorted(times) and times[-1] <= 90.0


@pytest.mark.parametrize("kind", ["silence", "noise"])
def test_silence_and_noise_give_no_text_with_openais_defaults(detector, kind):
    folder = detector[0]
    model, _ = mmtf.load(str(folder))
    wave = quiet_inputs()[kind]
    (row,) = model.transcribe([wave], language="en", timestamps=True)
    assert row["text"] == "" and row["segments"] == []
    (loud,) = model.transcribe([wave], language="en", timestamps=True, temperatures=[0.0],
                               no_speech_threshold="off")
    assert loud["text"]                    # the model does write text here without the rule


@torch.no_grad()
def test_word_timestamps_time_each_segments_words_inside_it(whisper):
    """Words of every segment, in order, inside the audio; together they are the text."""
    _, _, model, tokenizer = whisper
    wave = scene(40.0, 11)
    options = dataclasses.replace(PLAIN, word_timestamps=True)
    # Words only: no single bytes, no special ids.
    config = GenerationConfig(suppress_tokens=(*range(256), *range(tokenizer.eos_id + 1,
                                                                    tokenizer.timestamp_begin)))
    found = transcribe_long(model, model.encoder.whisper_features(torch.from_numpy(wave)),
                            prompt=WhisperPrompt(tokenizer).build("en", timestamps=True),
                            config=config, rules=rules_of(tokenizer), options=options,
                            text=lambda ids: tokenizer.decode(ids))
    words = [w for s in found for w in s.words]
    assert len(words) >= 4
    times = [t for w in words for t in (w["start"], w["end"])]
    assert times == sorted(times) and times[-1] <= 40.0
    # The words are the text (a word cut by a segment boundary goes to its first segment).
    text = "".join(tokenizer.decode([t for t in s.tokens if t < tokenizer.timestamp_begin])
                   for s in found)
    assert "".join(w["word"] for w in words) == text.replace(" ", "")
    assert any(w["start"] >= 29.0 for w in words)       # words of both windows
    assert "words" in found[0].as_dict()


@torch.no_grad()
def test_word_timestamps_equal_dtw_over_transformers_cross_attention(whisper):
    """The first window's words equal mmtf.decoders.align.word_spans over transformers'
    cross-attention of the same teacher-forced ids (the upper half of the layers, the rows
    that produced the text tokens and eos)."""
    from mmtf.decoders.align import caption_words, word_spans

    _, hf, model, tokenizer = whisper
    tb, wave = tokenizer.timestamp_begin, scene(40.0, 11)
    prompt = WhisperPrompt(tokenizer).build("en", timestamps=True)
    config = GenerationConfig(suppress_tokens=(*range(256), *range(tokenizer.eos_id + 1, tb)))
    features = model.encoder.whisper_features(torch.from_numpy(wave))
    found = transcribe_long(model, features, prompt=prompt, config=config,
                            rules=rules_of(tokenizer),
                            options=dataclasses.replace(PLAIN, word_timestamps=True),
                            text=tokenizer.decode)
    # The first window's segments: those whose first timestamp counts from 0 s.
    first = [s for s in found if abs(s.start - (s.tokens[0] - tb) * 0.02) < 1e-9]
    ids = [t for s in first for t in s.tokens if t < tb]
    head = [*prompt, tokenizer.no_timestamps_id]
    previous = hf.config._attn_implementation
    hf.set_attn_implementation("eager")             # the one that returns attention weights
    try:
        out = hf.model(input_features=features[None, :, :3000],
                       decoder_input_ids=torch.tensor([[*head, *ids]]), output_attentions=True)
    finally:
        hf.set_attn_implementation(previous)
    layers = range(hf.config.decoder_layers // 2, hf.config.decoder_layers)
    weights = torch.cat([out.cross_attentions[k][0] for k in layers])[:, len(head) - 1:]
    spans = word_spans(weights, caption_words(tokenizer, ids), 0.02, duration=30.0)
    assert len(spans) >= 2
    assert [(w["word"], w["start"], w["end"]) for s in first for w in s.words] == [
        (w.word, round(w.start, 3), round(w.end, 3)) for w in spans]
