"""The built-in question set: every answer recomputed from the clip's events, balanced letters,
held-out clips, determinism, and lines the reader accepts."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest
import soundfile as sf

from mmtf.data.errors import ErrorPolicy
from mmtf.data.formats import read_aqa
from mmtf.errors import UserError
from mmtf.synthetic import audio, ensure_synthetic
from mmtf.synthetic.aqa import write_qa_set

SCENE = dict(min_seconds=1.0, max_seconds=2.0, min_events=1, max_events=3,
             snr_db=(10.0, 30.0))
SIZES = dict(num_train=48, num_val=12, num_test=12, seed=3)
SPLITS = ("train", "val", "test")
# The test's own names of the nine events (the generator's vocabulary, written out again).
NAME = {("tone", "low"): "low tone", ("tone", "middle"): "middle tone",
        ("tone", "high"): "high tone", ("chirp", "rising"): "rising chirp",
        ("chirp", "falling"): "falling chirp", ("noise", "white"): "white noise burst",
        ("noise", "pink"): "pink noise burst", ("clicks", "slow"): "slow click train",
        ("clicks", "fast"): "fast click train"}
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4,
         "once": 1, "twice": 2, "three times": 3, "four times": 4}


@pytest.fixture(scope="module")
def qa_set(tmp_path_factory) -> Path:
    return ensure_synthetic(tmp_path_factory.mktemp("qa") / "set", "audio_qa", **SIZES,
                            **SCENE, num_workers=0)


def _lines(root: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (root / f"{split}.jsonl").read_text().splitlines()]


def _right(names: list[str], question: str) -> set[str]:
    """Every option text that answers ``question`` about the clip whose events, in time order,
    are ``names`` (an independent reading of the question)."""
    heard = set(names)
    if question == "Which sound is heard in the recording?":
        return heard
    if question == "Which sound is NOT heard in the recording?":
        return set(NAME.values()) - heard
    if question == "What is heard first?":
        return {names[0]}
    if question == "What is heard last?":
        return {names[-1]}
    if m := re.fullmatch(r"What is heard right after the (.+)\?", question):
        assert names.count(m[1]) == 1, "the sound a question is about must occur once"
        i = names.index(m[1])
        return {names[i + 1]} if i + 1 < len(names) else set()
    if question == "How many distinct sounds are heard?":
        return {w for w in ("one", "two", "three", "four") if WORDS[w] == len(heard)}
    if m := re.fullmatch(r"How many times is the (.+) heard\?", question):
        return {w for w in ("once", "twice", "three times", "four times")
                if WORDS[w] == names.count(m[1])}
    raise AssertionError(f"unknown question {question!r}")


def test_every_answer_is_the_one_right_option_for_the_clips_events(qa_set):
    checked = Counter()
    for split in SPLITS:
        for line in _lines(qa_set, split):
            i = int(re.fullmatch(rf"audio/{split}/synth_{split}_(\d+)\.wav", line["audio"])[1])
            scene = audio.clip_scene(SIZES["seed"], split, i, **SCENE)
            frames = sf.info(str(qa_set / line["audio"])).frames
            assert frames == round(scene.duration * 16000)      # the clip of these events
            names = [NAME[e] for e in scene.sequence]
            right = _right(names, line["question"])
            choices = line["choices"]
            assert len(choices) == 4 == len(set(choices))
            # Exactly one option is right, and it is the answer.
            assert [c for c in choices if c in right] == [line["answer"]], (line, names)
            if m := re.fullmatch(r"What is heard right after the (.+)\?", line["question"]):
                later = set(names[names.index(m[1]) + 1:])    # no second "after" answer
                assert [c for c in choices if c in later] == [line["answer"]], (line, names)
            letter = "ABCD"[choices.index(line["answer"])]
            user, assistant = line["messages"]
            assert user == {"role": "user", "content": "<|audio|>\n" + line["question"] + "\n"
                            + "\n".join(f"({x}) {c}" for x, c in zip("ABCD", choices))
                            + "\nAnswer with the letter."}
            assert assistant == {"role": "assistant", "content": f"({letter}) {line['answer']}"}
            checked[line["question_type"]] += 1
    assert set(checked) == {"presence", "absence", "order", "count"}, checked


def test_right_letters_are_balanced_per_split_and_type(qa_set):
    for split in SPLITS:
        lines = _lines(qa_set, split)
        by_type: dict[str, Counter] = {}
        for line in lines:
            letter = "ABCD"[line["choices"].index(line["answer"])]
            by_type.setdefault(line["question_type"], Counter())[letter] += 1
        for counts in by_type.values():
            assert max(counts[x] for x in "ABCD") - min(counts[x] for x in "ABCD") <= 1
        total = sum(by_type.values(), Counter())
        assert max(total[x] for x in "ABCD") - min(total[x] for x in "ABCD") <= len(by_type)


def test_splits_hold_different_clips(qa_set):
    digests = {}
    for split in SPLITS:
        lines = _lines(qa_set, split)
        assert len({line["id"] for line in lines}) == len(lines)
        clips = {line["audio"] for line in lines}
        assert len(clips) == SIZES[f"num_{split}"]       # every clip got questions
        digests[split] = {hashlib.sha256((qa_set / c).read_bytes()).hexdigest() for c in clips}
    assert not digests["train"] & digests["val"] and not digests["train"] & digests["test"]
    assert not digests["val"] & digests["test"]


def test_generation_is_deterministic_and_the_clips_are_the_caption_sets(tmp_path):
    small = dict(num_train=3, num_val=2, num_test=2, seed=5, **SCENE, num_workers=0)
    write_qa_set(tmp_path / "a", **small)
    write_qa_set(tmp_path / "b", **small)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*")
                   if p.is_file())
    assert len(files) == 3 + 7
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    caps = ensure_synthetic(tmp_path / "caps", "audio_captions", **{
        k: v for k, v in small.items()}, captions_per_clip=1)
    assert (caps / "validation" / "synth_validation_00001.wav").read_bytes() == \
        (tmp_path / "a" / "audio" / "val" / "synth_val_00001.wav").read_bytes()


def test_every_line_parses_and_reads(qa_set):
    for split in SPLITS:
        items = read_aqa(qa_set, split, report=ErrorPolicy("raise"))
        assert len(items) == len(_lines(qa_set, split))
        assert all(item.path.is_file() for item in items)


def test_questions_per_clip_is_checked(tmp_path):
    with pytest.raises(UserError, match=r"questions_per_clip \(5\) must be in 1\.\.4"):
        write_qa_set(tmp_path, questions_per_clip=5)
