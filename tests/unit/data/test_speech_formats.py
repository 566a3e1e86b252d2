"""Speech layouts: LibriSpeech, Common Voice (MP3), the manifest's text/language/task; the prompt
each item trains with; and each way the layout can be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import soundfile as sf

from mmtf.data import CaptionDataModule, DataError
from mmtf.data.audio import audio_info, load_audio, missing_codec
from mmtf.data.errors import ErrorPolicy
from mmtf.data.formats import read_common_voice, read_librispeech, read_manifest
from mmtf.errors import ConfigError
from mmtf.text import PretrainedTokenizer
from tests.unit.data.speech_sets import TEXTS, clip, write_common_voice, write_librispeech
from tests.unit.presets import flat

RAISE = ErrorPolicy("raise")
PROMPT = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]


@pytest.fixture(scope="module")
def whisper_tokenizer(tmp_path_factory) -> PretrainedTokenizer:
    from tests.unit.pretrained.tiny_hf import write_tokenizer

    folder = tmp_path_factory.mktemp("whisper_tok")
    write_tokenizer(folder, family="whisper")
    return PretrainedTokenizer.from_folder(folder, prompt=PROMPT)


# ------------------------------------------------------------------ LibriSpeech
def test_librispeech_reads_every_chapter(tmp_path):
    root = write_librispeech(tmp_path / "ls", {"train-clean-100": 5, "dev-clean": 2})
    items = read_librispeech(root, "train", report=RAISE)
    assert [i.id for i in items] == sorted(i.id for i in items) and len(items) == 5
    first = items[0]
    assert first.captions == (TEXTS[0],) and first.path.suffix == ".flac"
    assert first.path.parent.name == first.id.split("-")[1]          # <speaker>/<chapter>/
    assert (first.language, first.task) == ("en", "transcribe")
    assert first.where.endswith(".trans.txt line 1")
    assert len(read_librispeech(root, "val", report=RAISE)) == 2


def test_librispeech_joins_subsets_and_finds_the_librispeech_folder(tmp_path):
    write_librispeech(tmp_path / "LibriSpeech", {"train-clean-100": 2, "train-clean-360": 3})
    items = read_librispeech(tmp_path, "train", report=RAISE,
                             splits={"train": "train-clean-100+train-clean-360"})
    assert len(items) == 5


def test_librispeech_transcript_line_without_its_file(tmp_path):
    root = write_librispeech(tmp_path / "ls", {"train-clean-100": 4})
    gone = sorted(root.rglob("*.flac"))[1]
    gone.unlink()
    utt = gone.stem
    with pytest.raises(DataError, match=rf"{utt}.flac \(\S+.trans.txt line \d\): the transcript "
                                        rf"line of utterance {utt} has no audio file {utt}.flac"):
        read_librispeech(root, "train", report=RAISE)
    skip = ErrorPolicy("skip")
    assert len(read_librispeech(root, "train", report=skip)) == 3
    assert skip.counter.total == 1


def test_librispeech_missing_subset_names_the_layout(tmp_path):
    write_librispeech(tmp_path / "ls", {"train-clean-100": 1})
    with pytest.raises(DataError, match=r"librispeech index of split 'test'.*<speaker>/<chapter>"):
        read_librispeech(tmp_path / "ls", "test", report=RAISE)


# ------------------------------------------------------------------ Common Voice
def test_common_voice_reads_tsv_and_decodes_mp3(tmp_path):
    root = write_common_voice(tmp_path / "cv" / "en", {"train": 3, "dev": 1}, locale="en")
    items = read_common_voice(root, "train", report=RAISE)
    assert len(items) == 3 and items[0].path.suffix == ".mp3"
    assert items[0].captions == ('"' + TEXTS[0].capitalize() + '."',)   # quotes kept as text
    assert items[0].language == "en"
    info = audio_info(items[0].path)
    wave = load_audio(items[0].path, sample_rate=16000)
    assert info.sample_rate == 16000 and abs(wave.shape[0] - 16000) < 2000
    assert len(read_common_voice(root, "val", report=RAISE)) == 1


def test_common_voice_locale_to_whisper_code_and_missing_column(tmp_path):
    root = write_common_voice(tmp_path / "zh", {"train": 1}, locale="zh-CN")
    assert read_common_voice(root, "train", report=RAISE)[0].language == "zh"
    plain = write_common_voice(tmp_path / "old", {"train": 1}, locale=None)
    assert read_common_voice(plain, "train", report=RAISE)[0].language is None
    (plain / "train.tsv").write_text("client_id\tpath\nx\ty.mp3\n")
    with pytest.raises(DataError, match=r"missing column\(s\) \['sentence'\]"):
        read_common_voice(plain, "train", report=RAISE)


def test_mp3_without_a_decoder_names_the_codec(tmp_path, monkeypatch):
    path = tmp_path / "a.mp3"
    sf.write(str(path), clip(0), 16000, format="MP3")
    assert missing_codec(path) is None
    formats = {k: v for k, v in sf.available_formats().items() if k != "MP3"}
    monkeypatch.setattr(sf, "available_formats", lambda: formats)
    assert "has no MP3 decoder" in missing_codec(path)
    monkeypatch.setattr(sf, "info", lambda *_: (_ for _ in ()).throw(RuntimeError("bad")))
    with pytest.raises(DataError, match=r"has no MP3 decoder.*convert the clips to FLAC"):
        audio_info(path)


# ------------------------------------------------------------------ manifest
def test_manifest_text_language_task(tmp_path):
    sf.write(str(tmp_path / "a.flac"), clip(0), 16000)
    lines = [{"audio": "a.flac", "text": "guten morgen", "language": "fr"},
             {"audio": "a.flac", "text": "good morning", "task": "translate", "id": "t"},
             {"audio": "a.flac", "caption": "plain"}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    items = read_manifest(tmp_path, "train", report=RAISE)
    assert [(i.captions[0], i.language, i.task) for i in items] == [
        ("guten morgen", "fr", None), ("good morning", None, "translate"), ("plain", None, None)]
    (tmp_path / "train.jsonl").write_text(json.dumps({"audio": "a.flac", "text": "x",
                                                      "task": "summarise"}))
    with pytest.raises(DataError, match=r"'task' \('summarise'\) must be one of \['transcribe', "
                                        r"'translate'\]"):
        read_manifest(tmp_path, "train", report=RAISE)


# ------------------------------------------------------------------ prompts per item
def _manifest_module(root: Path, lines: list[dict], **kwargs) -> CaptionDataModule:
    sf.write(str(root / "a.flac"), clip(0), 16000)
    for split in ("train", "val", "test"):
        (root / f"{split}.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    return flat(CaptionDataModule, format="manifest", modality="audio", root=str(root), **kwargs)


def test_each_item_trains_with_its_own_prompt(tmp_path, whisper_tokenizer):
    tok = whisper_tokenizer
    dm = _manifest_module(tmp_path, [
        {"audio": "a.flac", "text": "a dog barks", "language": "fr"},
        {"audio": "a.flac", "text": "a dog barks", "task": "translate"},
        {"audio": "a.flac", "text": "a dog barks"}], language="en")
    dm.connect(tok)
    ids = [t[0] for t in dm.tokens("train")]
    body = tok.encode("a dog barks")[4:]
    expect = [["<|startoftranscript|>", "<|fr|>", "<|transcribe|>", "<|notimestamps|>"],
              ["<|startoftranscript|>", "<|en|>", "<|translate|>", "<|notimestamps|>"], PROMPT]
    for row, tokens in zip(ids, expect):
        assert row == [tok.token_to_id(t) for t in tokens] + body


def test_unknown_language_lists_the_models(tmp_path, whisper_tokenizer):
    dm = _manifest_module(tmp_path, [{"audio": "a.flac", "text": "x", "language": "xx"}])
    dm.connect(whisper_tokenizer)
    with pytest.raises(ConfigError, match=r"train.jsonl line 1: unknown language code 'xx'; the "
                                          r"model's languages are \['en', 'fr'\]"):
        dm.tokens("train")


def test_item_prompt_must_be_as_long_as_the_tokenizers(tmp_path, whisper_tokenizer):
    from tests.unit.pretrained.tiny_hf import write_tokenizer

    folder = tmp_path / "tok"
    write_tokenizer(folder, family="whisper")
    short = PretrainedTokenizer.from_folder(folder, prompt=["<|startoftranscript|>"])
    dm = _manifest_module(tmp_path, [{"audio": "a.flac", "text": "x", "language": "fr"}])
    dm.connect(short)
    with pytest.raises(ConfigError, match=r"train.jsonl line 1: the item's prompt .* is not as "
                                          r"long as tokenizer.prompt \['<\|startoftranscript"):
        dm.tokens("train")


def test_language_with_a_tokenizer_without_language_tokens(tmp_path):
    from mmtf.text import BPETokenizer

    dm = _manifest_module(tmp_path, [{"audio": "a.flac", "text": "a dog", "language": "fr"}])
    dm.connect(BPETokenizer.train(["a dog barks"] * 4, vocab_size=40))
    assert dm.tokens("train")[0][0][0] == 1            # [bos]: a language from the data is
    dm = _manifest_module(tmp_path, [{"audio": "a.flac", "text": "a dog"}], language="fr")
    dm.connect(BPETokenizer.train(["a dog barks"] * 4, vocab_size=40))   # ignored; asked: error
    with pytest.raises(ConfigError, match=r"data.language / data.speech_job are set but the "
                                          r"tokenizer's prompt \['<bos>'\] is not Whisper's"):
        dm.tokens("train")
