"""Mozilla Common Voice: read sentences in ~100 languages, as its per-language archives unpack.

Layout::

    root/train.tsv  root/dev.tsv  root/test.tsv    client_id path sentence ... [locale]
    root/clips/<path>                               MP3, 48 kHz (resampled to data.sample_rate)

A row's language is its ``locale`` column, else ``data.language`` (for Whisper, the part before
``-``: ``zh-CN`` -> ``zh``). Splits: train / val / test = train / dev / test. A libsndfile without
MP3 is a clear error naming the codec (:func:`mmtf.data.audio.missing_codec`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mmtf.data.formats.base import (
    CaptionItem,
    Report,
    bad_row,
    empty_caption,
    read_csv,
    require_index,
    split_name,
)

SPLIT_NAMES = {"train": "train", "val": "dev", "test": "test"}
COLUMNS = ("path", "sentence")


def whisper_language(locale: str) -> str:
    """Common Voice's locale as a Whisper language code: ``zh-CN`` -> ``zh``, ``sv-SE`` -> ``sv``."""
    return locale.strip().split("-")[0].lower()


def read_common_voice(root: Path, split: str, *, report: Report,
                      splits: Mapping[str, str] | None = None) -> list[CaptionItem]:
    """Read one split of a Common Voice language folder (see the module docstring).

    ``splits``: our split -> TSV stem (default train / dev / test)."""
    name = split_name(split, splits or SPLIT_NAMES, "common_voice")
    index = root / f"{name}.tsv"
    require_index(index, split, "common_voice", f" (expected {name}.tsv and clips/)")
    clips = root / "clips"
    items = []
    for line, row in read_csv(index, COLUMNS, "common_voice", tsv=True):
        where = f"{index.name} line {line}"
        rel = (row.get("path") or "").strip()
        if not rel:
            report(bad_row(index, line, "path is empty", "fill it in or delete the row"))
            continue
        sentence = (row.get("sentence") or "").strip()
        if not sentence:
            report(empty_caption(index, where, "sentence"))
            continue
        locale = (row.get("locale") or "").strip()
        items.append(CaptionItem(id=Path(rel).stem, path=clips / rel, captions=(sentence,),
                                 where=where,
                                 language=whisper_language(locale) if locale else None))
    return items
