"""AudioCaps (Kim et al., NAACL 2019): captions of AudioSet clips.

Layout::

    root/train.csv  root/val.csv  root/test.csv     audiocap_id,youtube_id,start_time,caption
    root/audio/train/*.wav  (or root/audio/*.wav, or root/train/*.wav)

Each CSV row is one caption; rows of the same clip (same ``youtube_id`` and ``start_time``; val
and test have 5 per clip) become one item with several references. AudioCaps ships no audio, and
downloaders name files differently, so a clip's file is looked up by stem, in this order:
``<audiocap_id>``, ``<youtube_id>``, ``Y<youtube_id>``, ``<youtube_id>_<start_time>``,
``Y<youtube_id>_<start_time>`` (any audio extension).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from mmtf.data.audio import AUDIO_EXTENSIONS
from mmtf.data.formats.base import (
    CaptionItem,
    Report,
    bad_row,
    empty_caption,
    read_csv,
    require_index,
    split_name,
)
from mmtf.errors import DataError

SPLIT_NAMES = {"train": "train", "val": "val", "test": "test"}
COLUMNS = ["audiocap_id", "youtube_id", "start_time", "caption"]


def audio_dir(root: Path, name: str) -> Path:
    """The folder holding a split's audio (first of audio/<split>, audio, <split>)."""
    for d in (root / "audio" / name, root / "audio", root / name):
        if d.is_dir():
            return d
    return root / "audio" / name


def _start_strings(start: str) -> list[str]:
    """Spellings of a start time used in file names: "30", "30.0", "30.000", ..."""
    out = [start]
    try:
        t = float(start)
    except ValueError:
        return out
    for s in (f"{t:g}", str(int(t)) if t.is_integer() else f"{t}", f"{t:.1f}", f"{t:.3f}"):
        if s not in out:
            out.append(s)
    return out


def read_audiocaps(root: Path, split: str, *, report: Report,
                   splits: Mapping[str, str] | None = None) -> list[CaptionItem]:
    """One split of an AudioCaps-layout dataset: an item per clip with all its captions.

    ``splits``: our split -> CSV name (default train / val / test)."""
    name = split_name(split, splits or SPLIT_NAMES, "audiocaps")
    index = root / f"{name}.csv"
    require_index(index, split, "audiocaps", f" (expected {name}.csv)")
    folder = audio_dir(root, name)
    stems = {}
    if folder.is_dir():
        for p in sorted(folder.iterdir()):
            if p.suffix.lower() in AUDIO_EXTENSIONS:
                stems.setdefault(p.stem, p)
    clips: dict[tuple[str, str], dict] = {}
    for line, row in read_csv(index, COLUMNS, "audiocaps"):
        where = f"{index.name} line {line}"
        ytid = (row.get("youtube_id") or "").strip()
        start = (row.get("start_time") or "").strip()
        if not ytid:
            report(bad_row(index, line, "youtube_id is empty", "fill it in or delete the row"))
            continue
        caption = (row.get("caption") or "").strip()
        if not caption:
            report(empty_caption(index, where, "caption"))
            continue
        clip = clips.setdefault((ytid, start), {"ids": [], "captions": [], "where": where})
        clip["ids"].append((row.get("audiocap_id") or "").strip())
        clip["captions"].append(caption)
    youtube_counts = Counter(ytid for ytid, _ in clips)
    items = []
    for (ytid, start), clip in clips.items():
        candidates = [*filter(None, clip["ids"]), ytid, f"Y{ytid}"]
        candidates += [f"{p}{ytid}_{s}" for s in _start_strings(start) for p in ("", "Y")]
        path = next((stems[c] for c in candidates if c in stems), None)
        if path is None:
            report(DataError.make(
                "missing_file", folder / f"{ytid}.wav",
                f"no audio file for clip {ytid} (start {start}) in {folder}; tried stems "
                f"{candidates[:4]} with extensions {list(AUDIO_EXTENSIONS[:4])}",
                "download the clip or delete its rows", clip["where"]))
            continue
        clip_id = ytid if youtube_counts[ytid] == 1 else f"{ytid}_{start}"
        items.append(CaptionItem(id=clip_id, path=path, captions=tuple(clip["captions"]),
                                 where=clip["where"]))
    return items
