"""Multiple-choice audio question answering as JSONL (DCASE 2025 task 5's fields, one file a split).

Layout: ``root/{train,val,test}.jsonl``, one question a line, paths relative to the file::

    {"id": "val_00003_1", "audio": "audio/val/synth_val_00003.wav", "question_type": "order",
     "question": "What is heard first?", "choices": ["high tone", "slow click train", ...],
     "answer": "slow click train",
     "messages": [{"role": "user", "content": "<|audio|>\\nWhat is heard first?\\n(A) ..."},
                  {"role": "assistant", "content": "(B) slow click train"}]}

``answer`` is the correct option's text (DCASE's convention); ``messages`` is the item as a chat
(:func:`mmtf.metrics.aqa.format_messages`), its assistant turn ``(<letter>) <answer>``. ``id``
defaults to ``<audio path without extension>#<line>``. Every line is checked; a bad one is
reported naming the file, the line and the key (raise, or skip with ``data.on_error=skip``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmtf.data.formats.base import Report, bad_row, require_index, split_name
from mmtf.metrics.aqa import AUDIO_PLACEHOLDER, LETTERS, parse_choice

SPLIT_NAMES = {"train": "train", "val": "val", "test": "test"}
KEYS = ("audio", "question_type", "question", "choices", "answer", "messages")


@dataclass(frozen=True)
class QAItem:
    """One question about one clip.

    Attributes:
        id, path, where: as :class:`~mmtf.data.formats.base.CaptionItem`.
        question_type: ``presence`` | ``absence`` | ``order`` | ``count`` in the built-in set.
        question, choices, answer: the question, the option texts (in letter order), the right
            option's text.
        messages: the chat turns, ``({"role": "user", ...}, {"role": "assistant", ...})``.
    """

    id: str
    path: Path
    where: str
    question_type: str
    question: str
    choices: tuple[str, ...]
    answer: str
    messages: tuple[dict[str, str], ...]


def qa_line_problem(obj: dict[str, Any]) -> tuple[str, str] | None:
    """(what is wrong, the fix) for one parsed line, or None when it is a valid item."""
    for key in KEYS:
        if key not in obj:
            return f"has no {key!r}", f"add the key {key!r}"
    for key in ("audio", "question_type", "question", "answer"):
        if not isinstance(obj[key], str) or not obj[key].strip():
            return f"{key!r} must be a non-empty string", f"fix {key!r}"
    choices = obj["choices"]
    if not isinstance(choices, list) or len(choices) < 2 or len(choices) > len(LETTERS) or \
            not all(isinstance(c, str) and c.strip() for c in choices):
        return ("'choices' must be a list of 2 to 26 non-empty strings",
                "fix 'choices'")
    if len(set(choices)) != len(choices):
        return f"'choices' repeat an option ({choices})", "make every option distinct"
    if obj["answer"] not in choices:
        return (f"'answer' ({obj['answer']!r}) is not one of 'choices' {choices}",
                "set 'answer' to the right option's exact text")
    messages = obj["messages"]
    if not isinstance(messages, list) or len(messages) != 2 or \
            [m.get("role") if isinstance(m, dict) else None for m in messages] != \
            ["user", "assistant"] or \
            not all(isinstance(m.get("content"), str) for m in messages):
        return ("'messages' must be [{\"role\": \"user\", \"content\": str}, {\"role\": "
                "\"assistant\", \"content\": str}]", "fix 'messages'")
    if AUDIO_PLACEHOLDER not in messages[0]["content"]:
        return (f"'messages' user content has no {AUDIO_PLACEHOLDER}",
                f"put {AUDIO_PLACEHOLDER} where the audio goes")
    right = choices.index(obj["answer"])
    chosen = parse_choice(messages[1]["content"], choices)
    if chosen != right:
        said = "no single option" if chosen is None else f"({LETTERS[chosen]})"
        return (f"'messages' assistant content ({messages[1]['content']!r}) names {said} but "
                f"'answer' is ({LETTERS[right]}) {obj['answer']!r}",
                "make the assistant turn \"(<letter>) <answer>\"")
    return None


def read_aqa(root: Path, split: str, *, report: Report,
             splits: Mapping[str, str] | None = None) -> list[QAItem]:
    """One split of a JSONL question set: an item per valid line (bad lines go to ``report``).

    Args:
        splits: our split -> file stem (default train / val / test).
    """
    name = split_name(split, splits or SPLIT_NAMES, "aqa")
    index = root / f"{name}.jsonl"
    require_index(index, split, "aqa", f" (expected {name}.jsonl)")
    items = []
    with open(index, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                report(bad_row(index, line_no, f"is not valid JSON ({e.msg})",
                               "fix the line or delete it"))
                continue
            if not isinstance(obj, dict):
                report(bad_row(index, line_no, "must be a JSON object", "fix the line"))
                continue
            problem = qa_line_problem(obj)
            if problem is not None:
                report(bad_row(index, line_no, *problem))
                continue
            rel = obj["audio"]
            path = Path(rel) if Path(rel).is_absolute() else index.parent / rel
            item_id = str(obj.get("id") or f"{Path(rel).with_suffix('').as_posix()}#{line_no}")
            items.append(QAItem(
                id=item_id, path=path, where=f"{index.name} line {line_no}",
                question_type=obj["question_type"], question=obj["question"],
                choices=tuple(obj["choices"]), answer=obj["answer"],
                messages=tuple(dict(m) for m in obj["messages"])))
    return items


def write_aqa_jsonl(root: Path, split: str, lines: Sequence[Mapping[str, Any]]) -> Path:
    """Write one split's question lines to ``root/<split>.jsonl`` (the writer of the built-in set)."""
    path = Path(root) / f"{SPLIT_NAMES[split]}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return path
