"""Clotho v2 (Drossos et al., ICASSP 2020): audio captioning, 5 captions per clip.

Layout (as the Zenodo archives unpack)::

    root/clotho_captions_development.csv   file_name,caption_1,...,caption_5
    root/clotho_captions_validation.csv
    root/clotho_captions_evaluation.csv
    root/development/*.wav                 (or root/clotho_audio_development/)
    root/validation/*.wav
    root/evaluation/*.wav

Splits: train = development, val = validation, test = evaluation. Any number of
``caption_<k>`` columns is read (Clotho has 5); ``clotho_metadata_*.csv`` files are ignored.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from mmtf.data.formats.base import (
    CaptionItem,
    Report,
    bad_row,
    clean_captions,
    read_csv,
    require_index,
    split_name,
)

SPLIT_NAMES = {"train": "development", "val": "validation", "test": "evaluation"}
_CAPTION_COL = re.compile(r"^caption_(\d+)$")


def csv_path(root: Path, name: str) -> Path:
    """The captions CSV of one split (``name`` = development | validation | evaluation)."""
    return root / f"clotho_captions_{name}.csv"


def read_clotho(root: Path, split: str, *, report: Report,
                splits: Mapping[str, str] | None = None) -> list[CaptionItem]:
    """One split of a Clotho-layout dataset: an item per CSV row with a non-empty caption.

    ``splits``: our split -> Clotho name (default development / validation / evaluation)."""
    name = split_name(split, splits or SPLIT_NAMES, "clotho")
    index = csv_path(root, name)
    require_index(index, split, "clotho", f" (expected clotho_captions_{name}.csv)")
    audio_dir = root / name
    if not audio_dir.is_dir() and (root / f"clotho_audio_{name}").is_dir():
        audio_dir = root / f"clotho_audio_{name}"
    items: list[CaptionItem] = []
    cap_cols: list[str] | None = None
    for line, row in read_csv(index, ["file_name", "caption_1"], "clotho"):
        if cap_cols is None:
            cap_cols = sorted((c for c in row if c and _CAPTION_COL.match(c)),
                              key=lambda c: int(c.split("_")[1]))
        where = f"{index.name} line {line}"
        file_name = (row.get("file_name") or "").strip()
        if not file_name:
            report(bad_row(index, line, "file_name is empty", "fill it in or delete the row"))
            continue
        captions = clean_captions([row.get(c) for c in cap_cols], index, where, report, cap_cols)
        if captions:
            items.append(CaptionItem(id=Path(file_name).stem, path=audio_dir / file_name,
                                     captions=captions, where=where))
    return items


def write_clotho_csv(root: Path, name: str,
                     rows: Sequence[tuple[str, Sequence[str]]]) -> Path:
    """Write ``clotho_captions_<name>.csv`` (``file_name, caption_1..caption_k``) of ``rows``,
    ``(file_name, captions)`` per clip, all with the same number of captions."""
    k = max((len(c) for _, c in rows), default=5)
    path = csv_path(root, name)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["file_name", *[f"caption_{i + 1}" for i in range(k)]])
        for file_name, caps in rows:
            w.writerow([file_name, *caps])
    return path
