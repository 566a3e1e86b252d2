"""Instruction data as JSONL: one conversation about one clip or image a line, one file a split.

Layout: ``root/{train,val,test}.jsonl``, paths relative to the file::

    {"id": "dog_1", "audio": "audio/dog.wav",
     "messages": [{"role": "system", "content": "You describe sounds."},
                  {"role": "user", "content": "<|audio|>\\nWhat is this?"},
                  {"role": "assistant", "content": "A dog.", "train": false},
                  {"role": "user", "content": "Describe it in detail."},
                  {"role": "assistant", "content": "A dog barks twice far away."}]}

``audio`` or ``image`` (one of them, the set's modality) names the media; ``messages`` is the
chat: roles ``system`` / ``user`` / ``assistant``, string contents, exactly one media
placeholder (``<|audio|>`` / ``<|image|>``) in a user turn, the last turn the assistant's.
Every assistant turn is trained unless it has ``"train": false``. Optional: ``id`` (default
``<media path without extension>#<line>``) and ``references`` (strings the final answer is
scored against; default: the final assistant turn). A line with ``choices`` and ``answer`` is
a multiple-choice question in :mod:`~mmtf.data.formats.aqa`'s form, checked as there, so the
AQA sets read as instruction sets too. Every line is checked; a bad one is reported naming the
file, the line and the key (raise, or skip with ``data.on_error=skip``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmtf.data.formats.aqa import qa_line_problem
from mmtf.data.formats.base import CaptionItem, QAFields, Report, bad_row, require_index, split_name
from mmtf.metrics.aqa import AUDIO_PLACEHOLDER

SPLIT_NAMES = {"train": "train", "val": "val", "test": "test"}
# The placeholder each modality's user turn holds: one token of the LLM's tokenizer, replaced
# by the projected media (mmtf.decoders.prefix).
MEDIA_TOKENS = {"audio": AUDIO_PLACEHOLDER, "image": "<|image|>"}
ROLES = ("system", "user", "assistant")
MESSAGE_KEYS = ("role", "content", "train")


def media_token(modality: str, override: str | None = None) -> str:
    """The placeholder of ``modality`` (``override`` when given: ``data.media_token``)."""
    return override or MEDIA_TOKENS[modality]


def messages_problem(messages: Any, placeholder: str,
                     others: Sequence[str] = ()) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a conversation, or None when it is a valid one.

    Args:
        messages: the parsed ``messages`` value.
        placeholder: the media placeholder the set's user turn must hold once.
        others: placeholders of other media, refused (an ``<|image|>`` in an audio set).
    """
    fix = "fix 'messages'"
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list of {\"role\", \"content\"} objects", fix
    holders = []
    for i, m in enumerate(messages):
        key = f"'messages'[{i}]"
        if not isinstance(m, dict):
            return f"{key} must be an object with 'role' and 'content'", fix
        unknown = sorted(set(m) - set(MESSAGE_KEYS))
        if unknown:
            return (f"{key} has unknown key(s) {unknown}",
                    f"keep only {list(MESSAGE_KEYS)} in a message")
        if m.get("role") not in ROLES:
            return f"{key}.role ({m.get('role')!r}) must be one of {list(ROLES)}", fix
        if not isinstance(m.get("content"), str) or not m["content"].strip():
            return f"{key}.content must be a non-empty string", fix
        if "train" in m and (m["role"] != "assistant" or not isinstance(m["train"], bool)):
            return (f"{key}.train ({m['train']!r}) must be true or false, on an assistant "
                    f"turn only", f"fix or remove {key}.train")
        for other in others:
            if other in m["content"]:
                return (f"{key}.content holds {other}, the placeholder of other media",
                        f"use {placeholder} in this set")
        count = m["content"].count(placeholder)
        if count and m["role"] != "user":
            return (f"{key} ({m['role']}) holds the media placeholder {placeholder}",
                    "put it in a user turn (media is a prompt, answers are text)")
        holders += [i] * count
    if len(holders) != 1:
        return (f"'messages' holds the media placeholder {placeholder} {len(holders)} times",
                f"put exactly one {placeholder} in a user turn, where the media goes (e.g. "
                f"\"{placeholder}\\nDescribe it.\")")
    if messages[-1]["role"] != "assistant":
        return ("the last of 'messages' is not an assistant turn",
                "end the conversation with the assistant's answer")
    if not any(m["role"] == "assistant" and m.get("train", True) for m in messages):
        return ("every assistant turn of 'messages' has train: false",
                "train at least one answer (drop its \"train\": false)")
    return None


def _references(obj: dict[str, Any]) -> tuple[list[str] | None, tuple[str, str] | None]:
    refs = obj.get("references")
    if refs is None:
        return [obj["messages"][-1]["content"].strip()], None
    if not isinstance(refs, list) or not refs or \
            not all(isinstance(r, str) and r.strip() for r in refs):
        return None, ("'references' must be a non-empty list of non-empty strings",
                      "fix 'references' or remove it (the final answer is the default)")
    return [r.strip() for r in refs], None


def read_instruction(root: Path, split: str, *, report: Report, modality: str = "audio",
                     splits: Mapping[str, str] | None = None,
                     placeholder: str | None = None) -> list[CaptionItem]:
    """One split of a JSONL instruction set: an item per valid line (bad lines go to
    ``report``); each a :class:`CaptionItem` with ``messages`` (and ``qa`` for questions).

    Args:
        modality: ``audio`` | ``image``: the key naming each line's media.
        splits: our split -> file stem (default train / val / test).
        placeholder: the media placeholder (default :data:`MEDIA_TOKENS` of ``modality``).
    """
    name = split_name(split, splits or SPLIT_NAMES, "instruction")
    index = root / f"{name}.jsonl"
    require_index(index, split, "instruction", f" (expected {name}.jsonl)")
    token = media_token(modality, placeholder)
    others = [t for t in MEDIA_TOKENS.values() if t != token]
    other_media = next(k for k in MEDIA_TOKENS if k != modality)
    items = []
    with open(index, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue

            def bad(problem: str, fix: str, line_no: int = line_no) -> None:
                report(bad_row(index, line_no, problem, fix))

            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                bad(f"is not valid JSON ({e.msg})", "fix the line or delete it")
                continue
            if not isinstance(obj, dict):
                bad("must be a JSON object", "fix the line")
                continue
            rel = obj.get(modality)
            if not isinstance(rel, str) or not rel.strip():
                hint = (f" (it has {other_media!r}: set data.modality={other_media})"
                        if other_media in obj else "")
                bad(f"has no {modality!r} path{hint}", f"add the key {modality!r}: the "
                    f"{modality} file, relative to {index.name}")
                continue
            if "id" in obj and (not isinstance(obj["id"], str) or not obj["id"].strip()):
                bad("'id' must be a non-empty string", "fix 'id' or remove it")
                continue
            problem = messages_problem(obj.get("messages"), token, others) \
                if "messages" in obj else ("has no 'messages'", "add the key 'messages'")
            qa = None
            if problem is None and ("choices" in obj or "answer" in obj):
                problem = qa_line_problem({"audio": rel, **obj})
                if problem is None:
                    qa = QAFields(question=obj["question"], question_type=obj["question_type"],
                                  choices=tuple(obj["choices"]), answer=obj["answer"])
            refs = None
            if problem is None:
                refs, problem = _references(obj)
            if problem is not None:
                bad(*problem)
                continue
            path = Path(rel) if Path(rel).is_absolute() else index.parent / rel
            item_id = str(obj.get("id") or f"{Path(rel).with_suffix('').as_posix()}#{line_no}")
            items.append(CaptionItem(
                id=item_id, path=path, captions=tuple(refs), where=f"{index.name} line {line_no}",
                messages=tuple(dict(m) for m in obj["messages"]), qa=qa))
    return items


def write_instruction_jsonl(path: str | Path, lines: Sequence[Mapping[str, Any]]) -> Path:
    """Write instruction lines (mappings as in the module doc) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return path


__all__ = ["MEDIA_TOKENS", "media_token", "messages_problem", "read_instruction",
           "write_instruction_jsonl"]
