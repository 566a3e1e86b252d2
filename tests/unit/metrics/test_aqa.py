"""The multiple-choice scorer: which option a reply chose, rotated variants, shuffle-robust
accuracy on a hand-worked set, and DDP-style merging of the count state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mmtf.metrics.aqa import (
    AQAAccuracy,
    aqa_scores,
    confusion_table,
    format_messages,
    parse_choice,
    rotate_item,
    rotations,
)

ANIMALS = ["cat", "dog", "bird", "cow"]


@pytest.mark.parametrize("reply, expected", [
    ("(B)", 1), ("B", 1), ("b", 1), ("c", 2), ("B.", 1), ("**B**", 1), (" (d) ", 3),
    ("B) dog", 1),
    ("B) cat", 1),                           # the letter wins over the text it is shown with
    ("The answer is (C).", 2), ("The answer is C", 2), ("Answer: d", 3),
    ("the correct option is D", 3), ("Option B is right.", 1), ("I think it is B.", 1),
    ("dog", 1), ("It is a dog.", 1), ("A dog barks.", 1),   # "A" the article is no letter
    ("the answer is a cow", 3),              # "a" followed by a word: the article again
    ("BIRD!", 2),
])
def test_a_reply_names_one_option(reply, expected):
    assert parse_choice(reply, ANIMALS) == expected


@pytest.mark.parametrize("reply", [
    "A or B", "(A) or (B)", "A, B", "(A) cat (B) dog",     # two letters: a hedge
    "cat or dog",                                          # two option texts
    "I don't know", "", "a horse",                         # no option at all
    "(E)",                                                 # no such letter among four options
])
def test_a_reply_naming_none_or_several_is_unparsed(reply):
    assert parse_choice(reply, ANIMALS) is None


def test_option_text_inside_a_longer_option_counts_as_the_longer():
    sounds = ["tone", "low tone", "rising chirp", "fast click train"]
    assert parse_choice("I hear a low tone", sounds) == 1
    assert parse_choice("just a tone", sounds) == 0
    assert parse_choice("There are two.", ["one", "two", "three", "four"]) == 1


ITEM = {"id": "q", "question_type": "order", "question": "What is heard first?",
        "choices": ["low tone", "high tone", "rising chirp", "white noise burst"],
        "answer": "rising chirp", "audio": "clip.wav"}


def test_messages_are_the_lettered_prompt_and_the_lettered_answer():
    user, assistant = format_messages(ITEM["question"], ITEM["choices"], ITEM["answer"])
    assert user == {"role": "user", "content": "<|audio|>\nWhat is heard first?\n(A) low tone\n"
                    "(B) high tone\n(C) rising chirp\n(D) white noise burst\n"
                    "Answer with the letter."}
    assert assistant == {"role": "assistant", "content": "(C) rising chirp"}


def test_the_answer_follows_its_text_through_every_rotation():
    variants = rotations(ITEM, 4)
    # Rotation r moves option i to (i + r) % 4: the answer (C, index 2) goes C, D, A, B.
    assert [v["messages"][1]["content"] for v in variants] == [
        "(C) rising chirp", "(D) rising chirp", "(A) rising chirp", "(B) rising chirp"]
    assert variants[1]["choices"] == ["white noise burst", "low tone", "high tone",
                                      "rising chirp"]
    for r, v in enumerate(variants):
        assert v["answer"] == "rising chirp" and v["rotation"] == r and v["audio"] == "clip.wav"
        assert v["choices"][(2 + r) % 4] == "rising chirp"
        assert sorted(v["choices"]) == sorted(ITEM["choices"])
        assert f"({'ABCD'[(2 + r) % 4]}) rising chirp" in v["messages"][0]["content"]
    assert rotate_item(ITEM, 0)["messages"] == format_messages(ITEM["question"], ITEM["choices"],
                                                               ITEM["answer"])


# A hand-worked set: 3 items, 2 question types, 4 rotations each.
ITEMS = [
    {"id": "q1", "question_type": "order", "question": "?", "choices": ["w", "x", "y", "z"],
     "answer": "x"},                              # right letter by rotation: B C D A
    {"id": "q2", "question_type": "order", "question": "?", "choices": ["p", "q", "r", "s"],
     "answer": "p"},                              # A B C D
    {"id": "q3", "question_type": "count", "question": "?",
     "choices": ["one", "two", "three", "four"], "answer": "three"},   # C D A B
]
REPLIES = [
    # q1: right under every rotation (r2 by the option's text: "x" is then at D).
    ("q1", 0, "(B)"), ("q1", 1, "C"), ("q1", 2, "x"), ("q1", 3, "A"),
    # q2: r0 right (A), r1 A is wrong (B), r2 right (C), r3 names nothing.
    ("q2", 0, "(A)"), ("q2", 1, "A"), ("q2", 2, "C"), ("q2", 3, "I don't know"),
    # q3: r0 A wrong (C), r1 two letters, r2 A right, r3 A wrong (B).
    ("q3", 0, "A"), ("q3", 1, "A or D"), ("q3", 2, "A"), ("q3", 3, "A"),
]
# Worked out:  rotation 0: q1, q2 right, q3 wrong -> accuracy 2/3.
# All 12 replies: q1 4 + q2 2 + q3 1 = 7 right -> mean_accuracy 7/12.
# Right under all 4 rotations: q1 only -> strict_accuracy 1/3. Unparsed: q2 r3, q3 r1 -> 2/12.
# order (q1, q2): 2/2, 6/8, 1/2, unparsed 1/8. count (q3): 0/1, 1/4, 0/1, unparsed 1/4.
# Confusion (right letter x chosen A B C D none):
#   A: q1r3 A, q2r0 A, q3r2 A          -> 3 0 0 0 0
#   B: q1r0 B, q2r1 A, q3r3 A          -> 2 1 0 0 0
#   C: q1r1 C, q2r2 C, q3r0 A          -> 1 0 2 0 0
#   D: q1r2 D, q2r3 none, q3r1 none    -> 0 0 0 1 2
EXPECTED = {
    "accuracy": 2 / 3, "mean_accuracy": 7 / 12, "strict_accuracy": 1 / 3,
    "unparsed": 2 / 12, "items": 3.0,
    "order/accuracy": 1.0, "order/mean_accuracy": 0.75, "order/strict_accuracy": 0.5,
    "order/unparsed": 1 / 8, "order/items": 2.0,
    "count/accuracy": 0.0, "count/mean_accuracy": 0.25, "count/strict_accuracy": 0.0,
    "count/unparsed": 0.25, "count/items": 1.0,
}
CONFUSION = torch.tensor([[3, 0, 0, 0, 0], [2, 1, 0, 0, 0], [1, 0, 2, 0, 0], [0, 0, 0, 1, 2]])


def _answers(replies):
    return [rotate_item(next(it for it in ITEMS if it["id"] == i), r)["messages"][1]["content"]
            for i, r, _ in replies]


def _update(metric, replies):
    ids, rots, texts = zip(*replies)
    metric.update(list(ids), list(rots), list(texts), _answers(replies))


def test_hand_worked_scores():
    metric = AQAAccuracy(ITEMS, rotations=4)
    _update(metric, REPLIES)
    scores, confusion = metric.compute(), metric.confusion()
    assert scores == pytest.approx(EXPECTED)
    assert torch.equal(confusion["all"], CONFUSION)
    # q3 alone: right A (r2) chose A, B (r3) chose A, C (r0) chose A, D (r1) chose none.
    assert confusion["count"].tolist() == [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0],
                                           [1, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
    table = confusion_table({"all": confusion["all"]})
    assert " 0.50 " in table.splitlines()[-1]          # half the replies chose A: letter bias
    plain = aqa_scores(ITEMS, REPLIES)                  # the plain function
    assert dict(plain) == pytest.approx(EXPECTED) and torch.equal(plain.confusion["all"],
                                                                   CONFUSION)


def test_ranks_sum_their_counts_and_padding_repeats_change_nothing():
    """Two ranks each score half the replies; rank 1 also repeats one (DistributedSampler
    padding). Merging the states (what torchmetrics' DDP sync does: the sum) gives the scores
    of one process that saw every reply once."""
    rank0, rank1 = AQAAccuracy(ITEMS), AQAAccuracy(ITEMS)
    _update(rank0, REPLIES[::2])
    _update(rank1, REPLIES[1::2] + [REPLIES[1]])
    assert rank0._reductions["votes"] is not None
    rank0.merge_state(rank1)
    assert rank0.compute() == pytest.approx(EXPECTED)
    assert torch.equal(rank0.confusion()["all"], CONFUSION)


def _ddp_worker(rank: int, world_size: int, store: str, out_dir: str) -> None:
    # A forked child of a process whose OpenMP pool started hangs in its first parallel
    # region on more than one thread (tests/forked.py, _fresh_threads): run on one.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world_size)
    try:
        mine = REPLIES[rank::world_size] + [REPLIES[0]]     # reply 0 again: sampler padding
        metric = AQAAccuracy(ITEMS)
        _update(metric, mine)
        scores, confusion = metric.compute(), metric.confusion()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
            {"scores": scores, "confusion": confusion["all"].tolist()}))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_score_as_one_process(tmp_path):
    """Two real ranks, each with half the replies and a padding repeat: torchmetrics' sync of
    the count state gives every rank the hand-worked scores and confusion."""
    # forked, not spawned: two new interpreters would spend ~10 s importing torch before gloo
    mp.start_processes(_ddp_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                       start_method="fork")
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["scores"] == pytest.approx(EXPECTED)
        assert got["confusion"] == CONFUSION.tolist()


def test_partial_replies_score_what_was_seen():
    metric = AQAAccuracy(ITEMS)
    _update(metric, [r for r in REPLIES if r[1] == 0])       # rotation 0 only
    scores = metric.compute()
    assert scores["accuracy"] == pytest.approx(2 / 3) and scores["items"] == 0.0
    assert scores["mean_accuracy"] == pytest.approx(2 / 3)
    assert scores["strict_accuracy"] != scores["strict_accuracy"]    # NaN: no item complete
    with pytest.raises(ValueError, match="no replies were accumulated"), \
            pytest.warns(UserWarning, match="called before the ``update``"):
        AQAAccuracy(ITEMS).compute()


def test_bad_updates_name_the_item():
    metric = AQAAccuracy(ITEMS)
    with pytest.raises(ValueError, match=r"item 'q1' rotation 1: the answer given \('\(B\) x'\)"
                                         r" is not \(C\) 'x'; make the variants with"):
        metric.update(["q1"], [1], ["B"], ["(B) x"])          # rotation 0's answer
    with pytest.raises(ValueError, match=r"item id 'q9' is not one of the 3 items"):
        metric.update(["q9"], [0], ["A"], ["A"])
    with pytest.raises(ValueError, match=r"rotation \(4\) of item 'q1' must be in 0\.\.3"):
        metric.update(["q1"], [4], ["A"], ["A"])
    with pytest.raises(ValueError, match=r"rotations \(5\) must be in 1\.\.4"):
        AQAAccuracy(ITEMS, rotations=5)
    with pytest.raises(ValueError, match=r"item 'bad': the answer \('v'\) must be exactly one"):
        AQAAccuracy([{**ITEMS[0], "id": "bad", "answer": "v"}])
