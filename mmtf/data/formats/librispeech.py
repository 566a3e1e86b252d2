"""LibriSpeech (Panayotov et al., ICASSP 2015): read English audiobooks, one transcript each.

Layout (as the OpenSLR archives unpack, under ``root`` or ``root/LibriSpeech``)::

    root/<split>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt
    root/<split>/<speaker>/<chapter>/<speaker>-<chapter>-<utterance>.flac

A transcript line is ``<utterance id> <TEXT>`` (upper case, no punctuation). Splits: train =
``train-clean-100``, val = ``dev-clean``, test = ``test-clean`` by default; ``data.splits``
names others, and several joined by ``+`` are read as one (``train-clean-100+train-clean-360+
train-other-500`` is the 960 h set). Every item is English transcription.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mmtf.data.formats.base import CaptionItem, Report, bad_row, missing_split, split_name
from mmtf.errors import DataError

SPLIT_NAMES = {"train": "train-clean-100", "val": "dev-clean", "test": "test-clean"}


def split_dir(root: Path, name: str) -> Path:
    """The folder of one LibriSpeech split (``root/<name>`` or ``root/LibriSpeech/<name>``)."""
    for folder in (root / name, root / "LibriSpeech" / name):
        if folder.is_dir():
            return folder
    return root / name


def read_librispeech(root: Path, split: str, *, report: Report,
                     splits: Mapping[str, str] | None = None) -> list[CaptionItem]:
    """One split of a LibriSpeech corpus: an item per transcript line with audio, by id.

    ``splits``: our split -> LibriSpeech subset name(s), ``+``-joined."""
    names = split_name(split, splits or SPLIT_NAMES, "librispeech").split("+")
    items: list[CaptionItem] = []
    for name in names:
        folder = split_dir(root, name.strip())
        if not folder.is_dir():
            raise missing_split(folder, split, "librispeech",
                                f" (expected {root}/{name}/<speaker>/<chapter>/*.trans.txt)")
        for index in sorted(folder.glob("*/*/*.trans.txt")):
            items += _read_transcripts(index, report)
    return sorted(items, key=lambda item: item.id)


def _read_transcripts(index: Path, report: Report) -> list[CaptionItem]:
    items = []
    audio = {p.stem: p for p in index.parent.iterdir() if p.suffix.lower() in (".flac", ".wav")}
    with open(index, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            utt, _, text = line.strip().partition(" ")
            text = text.strip()
            if not text:
                report(bad_row(index, line_no, f"utterance {utt!r} has no transcript text",
                               "write '<utterance id> <TEXT>' or delete the line"))
                continue
            path = audio.get(utt)
            if path is None:
                report(DataError.make(
                    "missing_file", index.parent / f"{utt}.flac",
                    f"the transcript line of utterance {utt} has no audio file {utt}.flac in "
                    f"{index.parent}", "restore the file or delete the line",
                    f"{index.name} line {line_no}"))
                continue
            items.append(CaptionItem(id=utt, path=path, captions=(text,),
                                     where=f"{index.name} line {line_no}", language="en",
                                     task="transcribe"))
    return items
