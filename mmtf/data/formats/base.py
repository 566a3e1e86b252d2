"""What every dataset format reader returns, and the CSV reading they share.

A caption reader turns an index into :class:`CaptionItem` s, a label reader into
:class:`LabelItem` s plus class names; readers only parse (decoding and file checks are
:mod:`mmtf.data.datasets`'s, which names each item's ``where``). Splits are always
``train`` / ``val`` / ``test``; each format maps them to its own names."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mmtf.errors import DataError, UserError

Split = Literal["train", "val", "test"]
SPLITS: tuple[str, ...] = ("train", "val", "test")
Report = Callable[[DataError], None]


@dataclass(frozen=True)
class CaptionItem:
    """One audio clip or image with all its reference captions.

    Attributes:
        id: stable identifier (file stem, COCO image id, AudioCaps YouTube id).
        path, captions: the media file and every non-empty reference caption.
        where: the index entry it came from, e.g. ``"clotho_captions_development.csv line 5"``.
        language: speech: the spoken language's code (``en``, ``de``: Whisper's codes), or None
            for the run's default (``data.language``).
        task: speech: ``transcribe`` or ``translate`` (to English), or None for the default.
        messages: an instruction item's conversation (``{"role", "content"[, "train"]}``
            mappings, :mod:`~mmtf.data.formats.instruction`); ``captions`` then holds the
            references its answers are scored against. None: a caption item.
        instruction: the user turn of a caption item trained as a chat (``data.instruction``
            written into shards); None: the data module's.
        qa: a multiple-choice question's fields (AQA lines read as instruction items).
    """

    id: str
    path: Path
    captions: tuple[str, ...]
    where: str
    language: str | None = None
    task: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    instruction: str | None = None
    qa: QAFields | None = None


@dataclass(frozen=True)
class QAFields:
    """What scores a multiple-choice item (:mod:`mmtf.metrics.aqa`): the question, its type,
    the option texts in letter order and the right option's text."""

    question: str
    question_type: str
    choices: tuple[str, ...]
    answer: str


@dataclass(frozen=True)
class LabelItem:
    """One audio clip or image with its class index."""

    id: str
    path: Path
    label: int
    where: str


@dataclass(frozen=True)
class LabelSet:
    """The items of one split and the class names shared by all splits."""

    items: list[LabelItem]
    class_names: list[str]


def split_name(split: str, names: Mapping[str, str], fmt: str) -> str:
    """The format's own name of a split (``train`` -> ``development`` for Clotho)."""
    if split not in SPLITS:
        raise UserError(f"split ({split!r}) must be one of {SPLITS}.")
    if split not in names:
        raise UserError(f"{fmt}: no file name for split {split!r} in data.splits ({dict(names)});"
                         f" add it, e.g. data.splits.{split}=...")
    return str(names[split])


def missing_split(path: Path, split: str, fmt: str, hint: str = "") -> DataError:
    """The error for a split whose index (file or folder) does not exist; never skippable."""
    return DataError.make("missing_split", path, f"the {fmt} index of split {split!r} does not "
                          f"exist", f"check data.root{hint}", skippable=False)


def require_index(path: Path, split: str, fmt: str, hint: str = "") -> None:
    """The index file of a split must exist: else :func:`missing_split`'s error."""
    if not path.is_file():
        raise missing_split(path, split, fmt, hint)


def read_csv(path: Path, required: Sequence[str], fmt: str, *,
             tsv: bool = False) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line number, row)`` of a CSV file with a header, checking the columns first.

    Args:
        path, required, fmt: the CSV file (UTF-8, optional BOM), the columns its header must
            have, and the format's name for messages.
        tsv: tab-separated and unquoted (Common Voice's sentences hold quotes of their own).

    Raises:
        DataError: missing columns (reason ``missing_columns``) or undecodable text.
    """
    kind, dialect = ("TSV", {"delimiter": "\t", "quoting": csv.QUOTE_NONE}) if tsv else ("CSV", {})
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f, **dialect)
            header = [h.strip() for h in (reader.fieldnames or [])]
            reader.fieldnames = header
            absent = [c for c in required if c not in header]
            if absent:
                raise DataError.make(
                    "missing_columns", path,
                    f"{fmt} {kind} is missing column(s) {absent} (header: {header})",
                    f"the header must contain {list(required)}", "line 1", skippable=False)
            for row in reader:
                yield reader.line_num, row
    except UnicodeDecodeError as e:
        raise DataError.make("bad_row", path, f"is not UTF-8 text ({e})",
                             "re-save it as UTF-8", skippable=False) from None


def bad_row(path: Path, line: int | str, problem: str, fix: str) -> DataError:
    """A row/line that cannot be used (reason ``bad_row``)."""
    where = f"line {line}" if isinstance(line, int) else line
    return DataError.make("bad_row", path, problem, fix, where)


def empty_caption(path: Path, where: str, what: str) -> DataError:
    """An empty caption (reason ``empty_caption``)."""
    return DataError.make("empty_caption", path, f"{what} is empty",
                          "fill it in or delete it", where)


def clean_captions(raw: Sequence[object], index: Path, where: str, report: Report,
                   names: Sequence[str] | None = None) -> tuple[str, ...]:
    """Strip captions and report the empty ones; return the non-empty ones."""
    out = []
    for k, c in enumerate(raw):
        text = c.strip() if isinstance(c, str) else ""
        if text:
            out.append(text)
        else:
            report(empty_caption(index, where, names[k] if names else f"caption {k + 1}"))
    return tuple(out)
