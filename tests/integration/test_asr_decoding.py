"""Speech decoding end to end on a pretrained Whisper folder used zero-shot (no checkpoint):
``mmtf.load(folder).transcribe`` and ``mmtf.predict ckpt_path=<folder>`` with language=auto,
timestamps, sequential and chunked long-form, srt output, against transformers' ``generate``
on the same tiny random weights; and the one-line errors (exit 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import mmtf
from mmtf.data.audio import load_audio
from mmtf.decoders.speech import merge_overlapping
from mmtf.predict import predict
from mmtf.predict.subtitles import to_srt
from mmtf.tasks.speech import overlap_reach
from tests.unit.pretrained.tiny_hf import whisper_bans, write_whisper

from .conftest import cli_in_process

transformers = pytest.importorskip("transformers")

RATE = 16000
MAX_NEW = 24
# transformers' greedy long-form without thresholds or context, MAX_NEW tokens per window.
ONE_PASS = {"temperatures": [0.0], "compression_ratio_threshold": None,
            "logprob_threshold": None, "no_speech_threshold": None,
            "condition_on_previous_text": False, "sample_len": MAX_NEW}


@pytest.fixture(scope="module")
def whisper(tmp_path_factory) -> tuple[Path, object]:
    folder = tmp_path_factory.mktemp("whisper_zero_shot")
    return folder, write_whisper(folder, speech=True, max_target_positions=64)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    """A 4 s noise clip and a 75 s clip of varying noise, as float WAVs."""
    folder = tmp_path_factory.mktemp("speech_clips")
    rng = np.random.default_rng(0)
    envelope = 0.05 + 0.5 * np.abs(np.sin(np.linspace(0, 30, 75 * RATE)))
    waves = {"short": (0.3 * rng.standard_normal(4 * RATE)).astype(np.float32),
             "long": (envelope * rng.standard_normal(75 * RATE)).astype(np.float32)}
    for name, wave in waves.items():
        sf.write(folder / f"{name}.wav", wave, RATE, subtype="FLOAT")
    return {name: folder / f"{name}.wav" for name in waves}


def hf_generate(hf, wave: np.ndarray, language: str, **options) -> list[tuple]:
    """transformers' Whisper generate with timestamps; mmtf's bans (the prompt's ids) as its
    suppress_tokens."""
    long = len(wave) > 30 * RATE
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    features = extractor(wave, sampling_rate=RATE, return_tensors="pt",
                         **(dict(truncation=False, padding="longest",
                                 return_attention_mask=True) if long else {}))
    lang = hf.generation_config.lang_to_id[f"<|{language}|>"]
    prompt = [hf.generation_config.decoder_start_token_id, lang,
              hf.generation_config.task_to_id["transcribe"]]
    out = hf.generate(features.input_features, attention_mask=features.get("attention_mask"),
                      return_timestamps=True, return_segments=True, language=language,
                      task="transcribe", max_new_tokens=MAX_NEW, temperature=0.0,
                      condition_on_prev_tokens=False, begin_suppress_tokens=None,
                      suppress_tokens=whisper_bans(hf.generation_config.no_timestamps_token_id,
                                                   prompt),
                      **options)
    return [(float(s["start"]), float(s["end"]), s["tokens"].tolist())
            for s in out["segments"][0]]


def test_zero_shot_transcribe_detects_the_language_and_times_segments_as_transformers(
        whisper, clips):
    folder, hf = whisper
    model, tokenizer = mmtf.load(str(folder), max_new_tokens=MAX_NEW)
    (row,) = model.transcribe([str(clips["short"])], language="auto", timestamps=True,
                              **ONE_PASS)
    wave = load_audio(clips["short"], sample_rate=RATE).numpy()
    features = transformers.WhisperFeatureExtractor(feature_size=80)(
        wave, sampling_rate=RATE, return_tensors="pt").input_features
    detected = int(hf.detect_language(features)[0])
    code = next(c for c, i in tokenizer.languages.items() if i == detected)
    assert row["language"] == code
    expected = hf_generate(hf, wave, code)
    assert [tokenizer.decode(t) for *_, t in expected] == [s["text"] for s in row["segments"]]
    np.testing.assert_allclose([(s["start"], s["end"]) for s in row["segments"]],
                               [e[:2] for e in expected], atol=1e-3)
    assert row["text"] == tokenizer.decode([t for *_, ts in expected for t in ts])
    # The settings of the call are not kept: caption() decodes with the folder's prompt again.
    assert model.speech.language is None and not model.speech.timestamps


def test_predict_sequential_long_form_equals_transformers_and_prints_srt(whisper, clips,
                                                                         tmp_path):
    folder, hf = whisper
    (row,) = predict(str(folder), [str(clips["long"])], {"language": "en", **ONE_PASS},
                     long_audio="sequential")
    wave = load_audio(clips["long"], sample_rate=RATE).numpy()
    expected = hf_generate(hf, wave, "en")
    _, tokenizer = mmtf.load(str(folder))
    assert [s["text"] for s in row["segments"]] == [tokenizer.decode(e[2]) for e in expected]
    np.testing.assert_allclose([(s["start"], s["end"]) for s in row["segments"]],
                               [e[:2] for e in expected], atol=1e-3)
    assert max(s["end"] for s in row["segments"]) > 60.0
    # openai's per-segment statistics (no_speech_prob: null with the threshold off).
    assert all(set(s) == {"start", "end", "text", "avg_logprob", "no_speech_prob",
                          "compression_ratio", "temperature"} for s in row["segments"])
    assert {s["temperature"] for s in row["segments"]} == {0.0}
    out = cli_in_process("mmtf.predict", [
        f"ckpt_path={folder}", f"inputs=[{clips['long']}]", "long_audio=sequential",
        "generation.language=en", *(f"generation.{k}={'off' if v is None else v}"
                                    for k, v in ONE_PASS.items()), "format=srt",
        f"output_dir={tmp_path / 'subs'}", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "subs" / "long.srt").read_text() == to_srt(row["segments"])


def test_predict_chunked_long_form_merges_the_chunks_texts(whisper, clips):
    folder, _ = whisper
    (row,) = predict(str(folder), [str(clips["long"])], {"max_new_tokens": MAX_NEW,
                                                         "chunk_overlap": 5.0},
                     long_audio="chunked")
    # Independently: the three chunks (30 s every 25 s) decoded as one batch, then merged.
    model, tokenizer = mmtf.load(str(folder), max_new_tokens=MAX_NEW)
    wave = load_audio(clips["long"], sample_rate=RATE)
    chunks = torch.zeros(3, 30 * RATE)
    sizes = []
    for k, start in enumerate([0, 25 * RATE, 50 * RATE]):
        part = wave[start:start + 30 * RATE]
        chunks[k, :len(part)], _ = part, sizes.append(len(part))
    out = model.model.generate(chunks, torch.tensor(sizes), **model.generation)
    texts = [[t for t in row if t not in tokenizer.special_ids] for row in out.tokens.tolist()]
    merged = merge_overlapping(texts, max_overlap=overlap_reach(texts, 5.0, 30.0))
    assert row["caption"] == tokenizer.decode(merged)
    assert len(merged) < sum(len(t) for t in texts) or not any(texts)
    assert "segments" not in row


@pytest.mark.parametrize("override, folder_kind, message", [
    ("generation.language=xx", "speech", r"generation.language='xx' is not a language of this "
                                         r"model .*; its codes: en zh de es ru ko fr ja"),
    ("generation.timestamps=true", "plain", r"generation.timestamps=true: the tokenizer .* "
                                            r"has no timestamp tokens"),
])
def test_bad_speech_options_are_one_line_errors(whisper, clips, tmp_path, override,
                                                folder_kind, message):
    import re

    folder = whisper[0]
    if folder_kind == "plain":
        folder = tmp_path / "plain"
        write_whisper(folder)                       # no timestamp tokens in its vocabulary
    out = cli_in_process("mmtf.predict", [f"ckpt_path={folder}", f"inputs=[{clips['short']}]",
                                          override, f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0"})   # the one-line form
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and re.search(message, lines[0]), out.stderr


def test_a_missing_checkpoint_is_not_taken_for_a_hub_id():
    from mmtf.errors import UserError

    with pytest.raises(UserError, match=r"runs/last.ckpt"):
        mmtf.load("runs/last.ckpt")


def test_evaluation_scores_whole_long_clips_with_long_form_decoding(whisper, clips):
    """evaluate long_audio=sequential: a batch the encoder cannot take whole is decoded with the
    long-form algorithm (no teacher-forced loss) and its text is what gets scored."""
    from mmtf.data.collate import pad_1d
    from mmtf.tasks.rebuild import build_pretrained_task

    folder, _ = whisper
    from mmtf.predict.model import Model

    task = build_pretrained_task(str(folder)).eval()
    task.update_generation({"long_form": "sequential", **ONE_PASS})
    wave = load_audio(clips["long"], sample_rate=RATE)
    audio, lengths = pad_1d([wave, wave[: 40 * RATE]], dtype=torch.float32)
    batch = {"audio": audio, "audio_lengths": lengths, "ids": ["a", "b"],
             "references": [["x"], ["y"]], "tokens": torch.zeros(2, 5, dtype=torch.long)}
    with torch.no_grad():
        task.test_step(batch, 0)
    scored = [row.prediction for row in task.caption_metrics["test"]._items]
    expected = [r["text"] for r in Model(task).transcribe([wave, wave[: 40 * RATE]])]
    assert scored == expected
