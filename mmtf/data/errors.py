"""Bad input: one exception type, and a counter for what was skipped.

A bad file raises :class:`DataError` naming the file, the index row, the problem and the fix;
under ``data.on_error=skip`` it is counted by ``reason`` in an :class:`ErrorCounter` instead.
Reasons:

================== =========================================================================
missing_file       the file a row points to does not exist
empty_file         the file has 0 bytes
undecodable        the decoder cannot read it (random bytes, unknown format, corrupt stream)
truncated          the header promises more data than the file holds
zero_length        audio with no samples
non_finite         audio with NaN or inf samples
channels           channel count differs from ``data.channels``
unreadable_image   PIL cannot open or fully load the image
empty_caption      a caption that is empty or whitespace only (the caption is dropped)
caption_truncated  a caption longer than ``max_caption_tokens`` (truncated, a warning)
bad_row            a row/line that cannot be parsed (bad JSON, bad number, unknown class)
missing_columns    a CSV/JSON without a required column/key (always raised: the whole file)
missing_split      the file of a split does not exist (always raised)
================== =========================================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from mmtf.errors import DataError, UserError

OnError = Literal["raise", "skip"]
ON_ERROR_CHOICES = ("raise", "skip")


def check_media_file(path: Path, where: str | None = None) -> None:
    """The one existence check of a media file an index points to: present and not empty.

    Raises:
        DataError: ``missing_file`` or ``empty_file`` (skippable), naming the file and row.
    """
    if not path.is_file():
        raise DataError.make("missing_file", path, "file not found",
                             "check the path and data.root", where)
    if path.stat().st_size == 0:
        raise DataError.make("empty_file", path, "file is empty (0 bytes)",
                             "re-copy or re-download it", where)


class ErrorCounter:
    """Counts skipped items per reason and keeps a few examples of each.

    Args:
        max_examples: how many locations to keep per reason for the report.
    """

    def __init__(self, max_examples: int = 3) -> None:
        self.max_examples = max_examples
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}

    def add(self, reason: str, where: str, n: int = 1) -> None:
        """Count ``n`` problems of kind ``reason`` found at ``where`` (file and row)."""
        self.counts[reason] += n
        ex = self.examples.setdefault(reason, [])
        if len(ex) < self.max_examples and where not in ex:
            ex.append(where)

    def add_error(self, err: DataError) -> None:
        """Count one :class:`DataError`."""
        self.add(err.reason, err.location())

    def update(self, records: Iterable[tuple[str, str]]) -> None:
        """Count ``(reason, where)`` records (what a DataLoader batch carries back)."""
        for reason, where in records:
            self.add(reason, where)

    def merge(self, other: ErrorCounter) -> None:
        """Add another counter's counts and examples to this one."""
        for reason, n in other.counts.items():
            self.counts[reason] += n
            ex = self.examples.setdefault(reason, [])
            for where in other.examples.get(reason, []):
                if len(ex) < self.max_examples and where not in ex:
                    ex.append(where)

    @property
    def total(self) -> int:
        """Number of problems counted."""
        return sum(self.counts.values())

    def __getitem__(self, reason: str) -> int:
        return self.counts[reason]

    def __bool__(self) -> bool:
        return self.total > 0

    def as_dict(self) -> dict[str, int]:
        """Counts per reason, most frequent first."""
        return dict(self.counts.most_common())

    def summary(self) -> str:
        """One line: ``"3 problems: non_finite=2 (e.g. a.wav), undecodable=1 (e.g. b.wav)"``."""
        if not self.counts:
            return "no problems"
        parts = [f"{r}={n} (e.g. {', '.join(self.examples.get(r, [])[:2]) or '?'})"
                 for r, n in self.counts.most_common()]
        return f"{self.total} problem(s): " + "; ".join(parts)

    def __repr__(self) -> str:
        return f"ErrorCounter({self.as_dict()})"


class ErrorPolicy:
    """Raise or count: the one place that applies ``data.on_error``.

    Args:
        on_error: ``"raise"`` or ``"skip"``.
        counter: where skipped problems are counted (a new one if not given).
    """

    def __init__(self, on_error: OnError = "raise", counter: ErrorCounter | None = None) -> None:
        if on_error not in ON_ERROR_CHOICES:       # the one check of data.on_error
            raise UserError(f"on_error ({on_error!r}) must be one of {ON_ERROR_CHOICES}; "
                            f"use data.on_error=raise (stop at the first bad item) or skip.")
        self.on_error = on_error
        self.counter = counter if counter is not None else ErrorCounter()

    def __call__(self, err: DataError) -> None:
        """Raise ``err`` (``on_error=raise``) or count it (``skip``)."""
        if self.on_error == "raise":
            raise err
        self.counter.add_error(err)
