"""The aqa JSONL reader (one line per question, each bad line named with its key) and the
question dataset / collate / data module over it."""

from __future__ import annotations

import json

import pytest
import torch

from mmtf.data import Collate
from mmtf.data.datasets import QADataset
from mmtf.data.errors import ErrorPolicy
from mmtf.data.formats import read_aqa
from mmtf.errors import DataError
from mmtf.synthetic import SyntheticQADataModule
from tests.unit.data.conftest import TINY_AUDIO, sine, write_audio
from tests.unit.presets import flat

CHOICES = ["low tone", "high tone", "rising chirp", "slow click train"]


def _line(**over):
    line = {"id": "q0", "audio": "clips/a.wav", "question_type": "presence",
            "question": "Which sound is heard in the recording?", "choices": CHOICES,
            "answer": "rising chirp",
            "messages": [{"role": "user", "content": "<|audio|>\nWhich sound ...?"},
                         {"role": "assistant", "content": "(C) rising chirp"}]}
    line.update(over)
    return json.dumps(line)


def test_a_valid_line_is_an_item(tmp_path):
    (tmp_path / "train.jsonl").write_text(_line() + "\n\n" + _line(id=None) + "\n")
    items = read_aqa(tmp_path, "train", report=ErrorPolicy("raise"))
    assert [i.id for i in items] == ["q0", "clips/a#3"]
    assert items[0].path == tmp_path / "clips" / "a.wav" and items[0].choices == tuple(CHOICES)
    assert items[0].answer == "rising chirp" and items[0].question_type == "presence"
    assert items[0].messages[1] == {"role": "assistant", "content": "(C) rising chirp"}


BAD = [
    ("{not json", r"is not valid JSON"),
    ("[1, 2]", r"must be a JSON object"),
    (_line(answer=None).replace(', "answer": null', ""), r"has no 'answer'; add the key"),
    (_line(question_type=""), r"'question_type' must be a non-empty string"),
    (_line(choices=["low tone"]), r"'choices' must be a list of 2 to 26 non-empty strings"),
    (_line(choices=["low tone", "low tone", "rising chirp"]), r"'choices' repeat an option"),
    (_line(answer="fast click train"), r"'answer' \('fast click train'\) is not one of"),
    (_line(messages=[{"role": "user", "content": "x"}]), r"'messages' must be \[\{"),
    (_line(messages=[{"role": "user", "content": "no audio"},
                     {"role": "assistant", "content": "(C) rising chirp"}]),
     r"'messages' user content has no <\|audio\|>"),
    (_line(messages=[{"role": "user", "content": "<|audio|>"},
                     {"role": "assistant", "content": "(B) high tone"}]),
     r"'messages' assistant content \('\(B\) high tone'\) names \(B\) but 'answer' is \(C\)"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_a_bad_line_names_the_file_line_and_key(tmp_path, text, message):
    (tmp_path / "val.jsonl").write_text(_line() + "\n" + text + "\n")
    with pytest.raises(DataError, match=r"val\.jsonl \(line 2\): " + message):
        read_aqa(tmp_path, "val", report=ErrorPolicy("raise"))
    policy = ErrorPolicy("skip")
    assert [i.id for i in read_aqa(tmp_path, "val", report=policy)] == ["q0"]
    assert policy.counter.as_dict() == {"bad_row": 1}


def test_a_missing_split_file_is_named(tmp_path):
    with pytest.raises(DataError, match=r"test\.jsonl: the aqa index of split 'test' does not "
                                        r"exist; check data\.root \(expected test\.jsonl\)"):
        read_aqa(tmp_path, "test", report=ErrorPolicy("raise"))


def test_the_dataset_yields_the_clip_and_the_chat_in_any_rotation(tmp_path):
    wave = sine(0.5, 16000)
    write_audio(tmp_path / "clips" / "a.wav", wave)
    write_audio(tmp_path / "clips" / "b.wav", sine(0.25, 16000, hz=880.0))
    (tmp_path / "val.jsonl").write_text("\n".join([
        _line(), _line(id="q1", question_type="absence", answer="low tone", messages=[
            {"role": "user", "content": "<|audio|>"},
            {"role": "assistant", "content": "(A) low tone"}]),
        _line(id="q2", audio="clips/b.wav")]) + "\n")
    items = read_aqa(tmp_path, "val", report=ErrorPolicy("raise"))
    ds = QADataset(items, modality="audio", rotations=4, cache_bytes=2 ** 20)
    first = ds[(0, 0, 0)]
    assert torch.allclose(first["audio"], torch.from_numpy(wave), atol=1e-4)
    assert first["messages"][1]["content"] == "(C) rising chirp" and first["rotation"] == 0
    turned = ds[(0, 1, 0)]                      # the caption slot picks rotation 1: C -> D
    assert turned["messages"][1]["content"] == "(D) rising chirp"
    assert turned["choices"] == ["slow click train", "low tone", "high tone", "rising chirp"]
    assert torch.equal(ds[1]["audio"], first["audio"])      # q1 asks about the same clip
    assert len(ds._cache) == 1                               # ... kept decoded once
    batch = Collate(modality="audio", targets="qa")([first, ds[2]])
    assert batch["audio"].shape == (2, 8000) and batch["audio_lengths"].tolist() == [8000, 4000]
    assert batch["ids"] == ["q0", "q2"] and batch["question_type"] == ["presence", "presence"]
    assert batch["answer"] == ["rising chirp"] * 2 and len(batch["messages"]) == 2


def test_the_built_in_module_generates_then_batches_questions(tmp_path):
    dm = flat(SyntheticQADataModule, format="aqa", root=str(tmp_path / "set"), batch_size=4,
              synthetic={"kind": "audio_qa", **TINY_AUDIO, "num_workers": 0})
    dm.setup("fit")
    assert len({it.path for it in dm.items("train")}) == TINY_AUDIO["num_train"]
    batch = next(iter(dm.val_dataloader()))
    assert batch["audio"].dtype == torch.float32 and len(batch["messages"]) == len(batch["ids"])
    assert all(m[0]["content"].startswith("<|audio|>\n") for m in batch["messages"])
