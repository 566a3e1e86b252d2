"""A plain JSONL manifest for any captioned audio or images.

Layout: ``root/{train,val,test}.jsonl``, one JSON object a line::

    {"audio": "clips/a.flac", "caption": "a dog barks"}
    {"image": "img/b.png", "caption": ["a red car", "a car parked outside"], "id": "b"}
    {"audio": "clips/d.flac", "text": "good morning", "language": "de", "task": "translate"}

The media key is ``audio``, ``image`` or ``path``, relative to the manifest's folder; ``caption``
/ ``captions`` / ``text`` is a string or a list; ``id`` defaults to the path without extension.
Speech lines may set ``language`` and ``task`` (else ``data.language`` / ``data.speech_job``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from mmtf.data.formats.base import (
    CaptionItem,
    Report,
    bad_row,
    clean_captions,
    require_index,
    split_name,
)

SPLIT_NAMES = {"train": "train", "val": "val", "test": "test"}
TASKS = ("transcribe", "translate")     # Whisper's two speech tasks


def read_manifest(root: Path, split: str, *, report: Report, modality: str = "audio",
                  splits: Mapping[str, str] | None = None) -> list[CaptionItem]:
    """One split of a JSONL manifest dataset: an item per valid line.

    Args:
        modality: ``audio`` | ``image``; a line with the other media key is a bad line.
        splits: our split -> manifest file stem (default train / val / test).
    """
    name = split_name(split, splits or SPLIT_NAMES, "manifest")
    index = root / f"{name}.jsonl"
    require_index(index, split, "manifest", f" (expected {name}.jsonl)")
    other = "image" if modality == "audio" else "audio"
    items = []
    with open(index, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{index.name} line {line_no}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                report(bad_row(index, line_no, f"is not valid JSON ({e.msg})",
                               "fix the line or delete it"))
                continue
            if not isinstance(obj, dict):
                report(bad_row(index, line_no, "must be a JSON object", "fix the line"))
                continue
            if other in obj and modality not in obj:
                report(bad_row(index, line_no, f"has an {other!r} path but data.modality is "
                               f"{modality!r}", f"set data.modality={other} or fix the line"))
                continue
            rel = obj.get(modality, obj.get("path"))
            if not isinstance(rel, str) or not rel:
                report(bad_row(index, line_no, f"needs a {modality!r} path",
                               f'add "{modality}": "relative/path"'))
                continue
            raw = obj.get("caption", obj.get("captions", obj.get("text")))
            if raw is None:
                report(bad_row(index, line_no, "needs a 'caption' or 'text' (string or list)",
                               'add "caption": "..." (or "text": "..." for a transcript)'))
                continue
            language, task = obj.get("language"), obj.get("task")
            if language is not None and (not isinstance(language, str) or not language.strip()):
                report(bad_row(index, line_no, f"'language' ({language!r}) must be a language "
                               f"code such as \"en\"", "fix it or remove the key"))
                continue
            if task is not None and task not in TASKS:
                report(bad_row(index, line_no, f"'task' ({task!r}) must be one of {list(TASKS)}",
                               "fix it or remove the key"))
                continue
            raw = [raw] if isinstance(raw, str) else raw
            if not isinstance(raw, list):
                report(bad_row(index, line_no, "'caption' must be a string or a list of "
                               "strings", "fix the line"))
                continue
            captions = clean_captions(raw, index, where, report)
            if not captions:
                continue
            path = Path(rel) if Path(rel).is_absolute() else index.parent / rel
            item_id = str(obj.get("id") or Path(rel).with_suffix("").as_posix())
            items.append(CaptionItem(id=item_id, path=path, captions=captions, where=where,
                                     language=language.strip() if language else None, task=task))
    return items
