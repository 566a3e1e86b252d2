"""ESC-50 (Piczak, ACM MM 2015): environmental sound classification in 5 folds.

Layout::

    root/meta/esc50.csv   filename,fold,target,category,esc10,src_file,take
    root/audio/<filename>

Splits are sets of folds (``data.folds``, default train 1-3, val 4, test 5; ESC-50's protocol is
5-fold cross-validation: sweep the test fold). Class names come from the ``target`` ->
``category`` pairs of the whole file, so every split has the same label space.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

from mmtf.data.formats.base import (
    LabelItem,
    LabelSet,
    Report,
    bad_row,
    read_csv,
    require_index,
)
from mmtf.errors import UserError

COLUMNS = ["filename", "fold", "target", "category", "esc10", "src_file", "take"]
REQUIRED = ["filename", "fold", "target", "category"]
DEFAULT_FOLDS = {"train": [1, 2, 3], "val": [4], "test": [5]}


def meta_path(root: Path) -> Path:
    """The metadata CSV."""
    return root / "meta" / "esc50.csv"


def read_esc50(root: Path, split: str, *, report: Report,
               folds: Mapping[str, Sequence[int]] | None = None) -> LabelSet:
    """One split (a set of folds) of an ESC-50-layout dataset: its items and the class names.

    ``folds``: our split -> list of folds (class name index = target)."""
    folds = folds or DEFAULT_FOLDS
    if split not in folds:
        raise UserError(f"esc50: no folds for split {split!r} in data.folds ({dict(folds)}); "
                         f"add e.g. data.folds.{split}=[5].")
    wanted = {int(f) for f in folds[split]}
    index = meta_path(root)
    require_index(index, split, "esc50", " (expected meta/esc50.csv)")
    names: dict[int, str] = {}
    rows = []
    for line, row in read_csv(index, REQUIRED, "esc50"):
        try:
            fold, target = int(row["fold"]), int(row["target"])
            if target < 0:
                raise ValueError("negative target")
        except (TypeError, ValueError):
            report(bad_row(index, line, f"fold ({row.get('fold')!r}) and target "
                           f"({row.get('target')!r}) must be integers >= 0", "fix the row"))
            continue
        category = (row.get("category") or "").strip() or f"class_{target}"
        if names.setdefault(target, category) != category:
            report(bad_row(index, line, f"target {target} is {category!r} here but "
                           f"{names[target]!r} earlier", "use one category per target"))
            continue
        filename = (row.get("filename") or "").strip()
        if not filename:
            report(bad_row(index, line, "filename is empty", "fill it in or delete the row"))
            continue
        rows.append((line, filename, fold, target))
    num_classes = max(names, default=-1) + 1
    class_names = [names.get(k, f"class_{k}") for k in range(num_classes)]
    items = [LabelItem(id=Path(fn).stem, path=root / "audio" / fn, label=t,
                       where=f"{index.name} line {line}")
             for line, fn, fold, t in rows if fold in wanted]
    return LabelSet(items=items, class_names=class_names)


def write_esc50_csv(root: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    """Write ``meta/esc50.csv`` with ESC-50's seven columns."""
    path = meta_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: row.get(k, "") for k in COLUMNS})
    return path
