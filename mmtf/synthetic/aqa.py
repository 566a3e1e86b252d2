"""Built-in audio question answering: multiple-choice questions about the sound-event clips.

The clips are :mod:`mmtf.synthetic.audio`'s, drawn by the same seeding rule: clip ``i`` of a
split is the caption set's clip ``i`` of that split for equal scene parameters
(:func:`~mmtf.synthetic.audio.clip_scene` recovers its events). Each clip gets up to
``questions_per_clip`` questions of different types, in DCASE 2025 task 5's form (four options,
exactly one right), written by :func:`mmtf.data.formats.aqa.write_aqa_jsonl`:

========  ====================================================  ==============================
type      questions                                             distractors
========  ====================================================  ==============================
presence  Which sound is heard in the recording?                3 absent sounds
absence   Which sound is NOT heard in the recording?            3 heard sounds (3 distinct heard)
order     What is heard first? / last? / right after the <x>?   the other heard sounds, then
                                                                absent ones (2+ events; <x>
                                                                heard once, not last)
count     How many distinct sounds are heard? /                 the other counts of one..four
          How many times is the <x> heard?                      (once..four times)
========  ====================================================  ==============================

Absent distractors prefer the answer's siblings (``low tone`` for ``high tone``: 3:1 odds),
the plausible confusions. A clip has at most 3 events, so ``four`` is never right. The right
answer's letter is balanced per question type: each run of 4 questions of a type in a split
puts it at A, B, C, D in a shuffled order. Why: see docs/design/audio-qa.md"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mmtf.data.formats.aqa import write_aqa_jsonl
from mmtf.errors import UserError
from mmtf.metrics.aqa import format_messages
from mmtf.synthetic import audio
from mmtf.synthetic.parallel import parallel_map

# Bump when the written bytes change; the clips' generator version is part of it.
VERSION = 100 * audio.VERSION + 1
SPLITS = audio.CAPTION_SPLITS           # their index seeds the clips, as in the caption set
NAMES: dict[tuple[str, str], str] = {
    ("tone", "low"): "low tone", ("tone", "middle"): "middle tone",
    ("tone", "high"): "high tone", ("chirp", "rising"): "rising chirp",
    ("chirp", "falling"): "falling chirp", ("noise", "white"): "white noise burst",
    ("noise", "pink"): "pink noise burst", ("clicks", "slow"): "slow click train",
    ("clicks", "fast"): "fast click train",
}
QUESTION_TYPES = ("presence", "absence", "order", "count")
NUMBERS = ("one", "two", "three", "four")
TIMES = ("once", "twice", "three times", "four times")
OPTIONS = 4
SIBLING_ODDS = 3.0


class Question(NamedTuple):
    """A question before its options are placed: the right option and three wrong ones."""

    question_type: str
    question: str
    answer: str
    distractors: tuple[str, ...]


def _absent(rng: np.random.Generator, exclude: set[tuple[str, str]], near: set[str],
            n: int) -> list[tuple[str, str]]:
    """``n`` event classes not in ``exclude``, those of a kind in ``near`` at 3:1 odds."""
    pool = [ev for ev in audio.EVENTS if ev not in exclude]
    weights = np.array([SIBLING_ODDS if kind in near else 1.0 for kind, _ in pool])
    picks = rng.choice(len(pool), size=n, replace=False, p=weights / weights.sum())
    return [pool[int(k)] for k in picks]


def _order(scene: audio.Scene, rng: np.random.Generator) -> Question | None:
    seq = list(scene.sequence)
    if len(seq) < 2:
        return None
    once = [i for i, ev in enumerate(seq[:-1]) if seq.count(ev) == 1]
    kinds = ["first", "last"] + (["after"] if once else [])
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "first":
        question, right, ruled_out = "What is heard first?", seq[0], {seq[0]}
    elif kind == "last":
        question, right, ruled_out = "What is heard last?", seq[-1], {seq[-1]}
    else:
        i = once[int(rng.integers(len(once)))]
        question, right = f"What is heard right after the {NAMES[seq[i]]}?", seq[i + 1]
        # Every sound after <x> is left out: "after" must not read as a second right answer.
        ruled_out = set(seq[i + 1:])
    heard = [ev for ev in dict.fromkeys(seq) if ev not in ruled_out]
    wrong = [heard[int(k)] for k in rng.permutation(len(heard))][:OPTIONS - 1]
    wrong += _absent(rng, set(seq), {right[0]}, OPTIONS - 1 - len(wrong))
    return Question("order", question, NAMES[right], tuple(NAMES[ev] for ev in wrong))


def _count(scene: audio.Scene, rng: np.random.Generator) -> Question:
    seq = list(scene.sequence)
    if rng.random() < 0.5:
        right = len(set(seq))
        return Question("count", "How many distinct sounds are heard?", NUMBERS[right - 1],
                        tuple(w for k, w in enumerate(NUMBERS) if k != right - 1))
    distinct = list(dict.fromkeys(seq))
    target = distinct[int(rng.integers(len(distinct)))]
    right = seq.count(target)
    return Question("count", f"How many times is the {NAMES[target]} heard?", TIMES[right - 1],
                    tuple(w for k, w in enumerate(TIMES) if k != right - 1))


def clip_questions(scene: audio.Scene, rng: np.random.Generator, per_clip: int) -> list[Question]:
    """Up to ``per_clip`` questions about ``scene``, of distinct types, in a random order."""
    seq = list(scene.sequence)
    heard = list(dict.fromkeys(seq))
    makers: dict[str, Any] = {
        "presence": lambda: _presence(heard, rng),
        "order": lambda: _order(scene, rng),
        "count": lambda: _count(scene, rng),
    }
    if len(heard) >= OPTIONS - 1:
        makers["absence"] = lambda: _absence(heard, rng)
    if len(seq) < 2:
        del makers["order"]
    types = [t for t in QUESTION_TYPES if t in makers]
    chosen = [types[int(k)] for k in rng.permutation(len(types))][:per_clip]
    return [q for q in (makers[t]() for t in chosen) if q is not None]


def _presence(heard: list[tuple[str, str]], rng: np.random.Generator) -> Question:
    right = heard[int(rng.integers(len(heard)))]
    wrong = _absent(rng, set(heard), {right[0]}, OPTIONS - 1)
    return Question("presence", "Which sound is heard in the recording?", NAMES[right],
                    tuple(NAMES[ev] for ev in wrong))


def _absence(heard: list[tuple[str, str]], rng: np.random.Generator) -> Question:
    right = _absent(rng, set(heard), {kind for kind, _ in heard}, 1)[0]
    wrong = [heard[int(k)] for k in rng.permutation(len(heard))][:OPTIONS - 1]
    return Question("absence", "Which sound is NOT heard in the recording?", NAMES[right],
                    tuple(NAMES[ev] for ev in wrong))


class LetterBalance:
    """Where each question type's next right answer goes: runs of 4 in a shuffled order."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.queues: dict[str, list[int]] = {}

    def next(self, question_type: str) -> int:
        queue = self.queues.setdefault(question_type, [])
        if not queue:
            queue.extend(int(k) for k in self.rng.permutation(OPTIONS))
        return queue.pop(0)


def place(question: Question, position: int, rng: np.random.Generator) -> list[str]:
    """The options in letter order: the answer at ``position``, the distractors shuffled."""
    wrong = [question.distractors[int(k)] for k in rng.permutation(len(question.distractors))]
    return wrong[:position] + [question.answer] + wrong[position:]


def write_qa_set(root: str | Path, *, num_train: int = 3000, num_val: int = 300,
                 num_test: int = 300, seed: int = 0, sample_rate: int = 16000,
                 min_seconds: float = 2.0, max_seconds: float = 6.0, min_events: int = 1,
                 max_events: int = 3, snr_db: Sequence[float] = (10.0, 30.0),
                 questions_per_clip: int = 3, num_workers: int = 2) -> None:
    """Write the question set under ``root``: ``audio/<split>/synth_<split>_<i>.wav`` and
    ``<split>.jsonl`` for train / val / test (held-out clips: a clip is in one split only).

    Args:
        num_train, num_val, num_test: clips per split (each with up to ``questions_per_clip``
            questions, 1-4, of distinct types).
        seed: everything is a function of (seed, split, clip index).
        The others: as :func:`mmtf.synthetic.audio.write_caption_set`.
    """
    audio._check_scene_args(min_seconds, max_seconds, min_events, max_events)
    if not 1 <= questions_per_clip <= len(QUESTION_TYPES):
        raise UserError(f"questions_per_clip ({questions_per_clip}) must be in 1.."
                        f"{len(QUESTION_TYPES)} (one question per type and clip).")
    root = Path(root)
    scene_kw = dict(min_seconds=min_seconds, max_seconds=max_seconds, min_events=min_events,
                    max_events=max_events, snr_db=tuple(snr_db))
    for split_idx, (split, count) in enumerate(zip(SPLITS, (num_train, num_val, num_test))):
        folder = root / "audio" / split
        folder.mkdir(parents=True, exist_ok=True)
        tasks = [(str(folder / f"synth_{split}_{i:05d}.wav"), (seed, split_idx, i), sample_rate,
                  scene_kw, 0) for i in range(count)]
        parallel_map(audio._clip, tasks, num_workers)
        # Questions in clip order in this process: the letter balance runs over the split.
        balance = LetterBalance(np.random.default_rng([seed, split_idx]))
        lines = []
        for i in range(count):
            scene = audio.clip_scene(seed, split, i, **scene_kw)
            rng = np.random.default_rng([seed, split_idx, i, 3])
            for k, q in enumerate(clip_questions(scene, rng, questions_per_clip)):
                choices = place(q, balance.next(q.question_type), rng)
                lines.append({
                    "id": f"{split}_{i:05d}_{k}", "audio": f"audio/{split}/synth_{split}_{i:05d}.wav",
                    "question_type": q.question_type, "question": q.question, "choices": choices,
                    "answer": q.answer, "messages": format_messages(q.question, choices, q.answer)})
        write_aqa_jsonl(root, split, lines)
