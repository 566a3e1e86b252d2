"""PretrainedTokenizer: a tokenizer.json with its own special ids and prompt (GPT-2's and
Whisper's conventions), encode/decode against the `tokenizers` library directly, and the round
trip through a task checkpoint."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer

from mmtf.errors import UserError
from mmtf.tasks import stored_tokenizer
from mmtf.text import PretrainedTokenizer, Tokenizer, build_tokenizer
from mmtf.text.prompt import WhisperPrompt
from tests.unit.pretrained.tiny_hf import ENDOFTEXT, WHISPER_PROMPT, write_tokenizer
from tests.unit.tasks.conftest import captioner


def test_gpt2_conventions_bos_eos_pad_are_endoftext(tmp_path):
    hf = write_tokenizer(tmp_path, family="gpt2")
    tok = PretrainedTokenizer.from_folder(tmp_path)
    end = hf.token_to_id(ENDOFTEXT)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id) == (end, end, end, end)
    assert tok.prompt_ids == [end]
    body = hf.encode("a dog barks", add_special_tokens=False).ids
    ids = tok.encode("a dog barks")
    assert ids == [end, *body, end]
    # bos == eos: the leading prompt is not mistaken for the end of the caption.
    assert tok.decode(ids) == "a dog barks"
    assert tok.decode([*body, end, end, end]) == "a dog barks"   # generated: eos then pads


def test_whisper_prompt_and_specials(tmp_path):
    hf = write_tokenizer(tmp_path, family="whisper")
    tok = PretrainedTokenizer.from_folder(tmp_path, prompt=WHISPER_PROMPT)
    prompt = [hf.token_to_id(t) for t in WHISPER_PROMPT]
    end = hf.token_to_id(ENDOFTEXT)
    assert tok.prompt_ids == prompt and tok.eos_id == tok.pad_id == end
    assert tok.vocab_size == hf.get_vocab_size(with_added_tokens=True)
    ids = tok.encode("rain falls")
    assert ids == [*prompt, *hf.encode("rain falls", add_special_tokens=False).ids, end]
    assert tok.decode(ids) == "rain falls"
    assert tok.decode(ids, skip_special=False).startswith("<|startoftranscript|><|en|>")
    # Truncation keeps the prompt and the final eos.
    cut = tok.encode("rain falls on a tin roof", max_len=6)
    assert len(cut) == 6 and cut[:4] == prompt and cut[-1] == end
    with pytest.raises(UserError, match=r"max_len \(4\) must be >= 5 to hold the prompt"):
        tok.encode("rain", max_len=4)
    # A caption that spells a special token is text, not the special id.
    assert end not in tok.encode("<|endoftext|>", add_special=False)


def test_json_and_checkpoint_round_trip(tmp_path):
    write_tokenizer(tmp_path, family="whisper")
    tok = build_tokenizer({"kind": "pretrained", "path": str(tmp_path),
                           "prompt": WHISPER_PROMPT})
    restored = Tokenizer.from_json_str(tok.to_json_str())
    assert isinstance(restored, PretrainedTokenizer) and restored == tok
    assert restored.prompt_ids == tok.prompt_ids and restored.pad_id == tok.pad_id
    assert json.loads(tok.to_json_str())["tokenizer"]["model"]["type"] == "BPE"
    # Through a captioning task's checkpoint: the model takes the tokenizer's ids.
    task = captioner(vocab_size=tok.vocab_size)
    task.model.decoder.pad_id = tok.pad_id       # a decoder configured for this tokenizer
    checkpoint = {"mmtf": {"config": {}, "tokenizer": tok.to_json_str()}}
    task.use_tokenizer(stored_tokenizer(checkpoint))
    task.on_load_checkpoint(checkpoint)
    saved: dict = {}
    task.on_save_checkpoint(saved)
    again = Tokenizer.from_json_str(saved["mmtf"]["tokenizer"])
    assert again == tok
    assert task.model.prompt_ids == tok.prompt_ids
    assert (task.model.eos_id, task.model.pad_id) == (tok.eos_id, tok.pad_id)


def test_bad_folders_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match=r"tokenizer.json .* does not exist"):
        PretrainedTokenizer.from_folder(tmp_path)
    write_tokenizer(tmp_path, family="whisper")
    with pytest.raises(UserError, match=r"prompt token '<\|de\|>' is not in .*tokenizer.json"):
        PretrainedTokenizer.from_folder(tmp_path, prompt=["<|startoftranscript|>", "<|de|>"])
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(UserError, match=r"names no eos_token"):
        PretrainedTokenizer.from_folder(tmp_path)


def test_mmtf_tokenizers_keep_their_ids():
    from mmtf.text import CharTokenizer

    tok = CharTokenizer.train(["ab"])
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id, tok.prompt_ids) == (0, 1, 2, 3, [1])
    assert isinstance(HFTokenizer, type)


def test_whisper_speech_tokens_come_from_the_vocabulary(tmp_path):
    from tests.unit.pretrained.tiny_hf import SPEECH_LANGUAGES, TIMESTAMPS

    hf = write_tokenizer(tmp_path, family="whisper_speech")
    tok = PretrainedTokenizer.from_folder(tmp_path)
    assert tok.languages == {code: hf.token_to_id(f"<|{code}|>") for code in SPEECH_LANGUAGES}
    assert list(tok.languages) == SPEECH_LANGUAGES                       # Whisper's order
    assert tok.task_ids == {"transcribe": hf.token_to_id("<|transcribe|>"),
                            "translate": hf.token_to_id("<|translate|>")}
    assert tok.timestamp_begin == hf.token_to_id("<|0.00|>") == tok.no_timestamps_id + 1
    assert hf.token_to_id(TIMESTAMPS[-1]) == tok.timestamp_begin + 1500   # <|30.00|>
    sot = hf.token_to_id("<|startoftranscript|>")
    fr, translate = tok.languages["fr"], tok.task_ids["translate"]
    assert WhisperPrompt(tok).build("fr", "translate") == [sot, fr, translate, tok.no_timestamps_id]
    assert WhisperPrompt(tok).build("fr", "translate", timestamps=True) == [sot, fr, translate]
    # Timestamps are never text, though the hub's tokenizer.json adds them as non-special.
    words = hf.encode("rain falls", add_special_tokens=False).ids
    assert tok.decode([tok.timestamp_begin, *words, tok.timestamp_begin + 50]) == "rain falls"
    with pytest.raises(UserError, match=r"generation.language='xx' is not a language of this "
                                        r"model .*; its codes: en zh de es ru ko fr ja \(or auto"):
        WhisperPrompt(tok).build("xx")
    with pytest.raises(UserError, match=r"generation.task='summarize' is not a task"):
        WhisperPrompt(tok).build("en", "summarize")
    # English-only models (generation_config.json is_multilingual: false): <|sot|> alone.
    (tmp_path / "generation_config.json").write_text(json.dumps({"is_multilingual": False}))
    english = PretrainedTokenizer.from_folder(tmp_path)
    assert WhisperPrompt(english).build("en") == [sot, english.no_timestamps_id]
    assert WhisperPrompt(english).build(None, timestamps=True) == [sot]
    with pytest.raises(UserError, match=r"English-only model transcribes English only; got "
                                        r"language='fr'"):
        WhisperPrompt(english).build("fr")
    restored = Tokenizer.from_json_str(english.to_json_str())
    assert restored == english and not restored.multilingual
    # A checkpoint written before the flag existed reads as multilingual.
    payload = json.loads(tok.to_json_str())
    del payload["multilingual"]
    assert Tokenizer.from_json_str(json.dumps(payload)) == tok


def test_timestamps_on_a_vocabulary_without_timestamp_tokens_is_a_one_line_error(tmp_path):
    """Without the timestamp strings the first timestamp is <|notimestamps|> + 1 (openai,
    transformers); a decoder without those rows is refused in one line."""
    from mmtf.tasks.speech import SpeechOptions, check_speech

    write_tokenizer(tmp_path, family="whisper")
    tok = PretrainedTokenizer.from_folder(tmp_path)
    assert tok.timestamp_begin == tok.no_timestamps_id + 1 == tok.vocab_size
    options = SpeechOptions(timestamps=True)
    check_speech(options, tok, vocab_size=tok.vocab_size + 1501)      # the model has the rows
    with pytest.raises(UserError, match=r"generation.timestamps=true: the tokenizer .* has no "
                                        r"timestamp tokens .*; set generation.timestamps=false"):
        check_speech(options, tok, vocab_size=tok.vocab_size)
