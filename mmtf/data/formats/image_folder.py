"""torchvision ``ImageFolder`` layout: one folder per class.

With splits, ``root/{train,val,test}/<class>/*.png`` (classes from ``train``; an unknown class
elsewhere is a bad row); without, ``root/<class>/*.png`` split per class by ``val_fraction`` /
``test_fraction`` and ``seed``. Found by torchvision's ``find_classes`` / ``make_dataset``, so
class indices match ``torchvision.datasets.ImageFolder``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from torchvision.datasets.folder import find_classes, make_dataset

from mmtf.data.formats.base import (
    LabelItem,
    LabelSet,
    Report,
    bad_row,
    missing_split,
    split_name,
)
from mmtf.data.image import IMAGE_EXTENSIONS
from mmtf.errors import UserError

SPLIT_NAMES = {"train": "train", "val": "val", "test": "test"}


def _files(directory: Path, class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
    return make_dataset(str(directory), class_to_idx, extensions=IMAGE_EXTENSIONS,
                        allow_empty=True)


def read_image_folder(root: Path, split: str, *, report: Report,
                      splits: Mapping[str, str] | None = None, val_fraction: float = 0.1,
                      test_fraction: float = 0.1, seed: int = 0) -> LabelSet:
    """One split of an ImageFolder-layout dataset: its items and the class names.

    Args:
        splits: our split -> sub-folder name (default train / val / test).
        val_fraction, test_fraction: each class's share when there are no split folders.
        seed: shuffles the files before the fractional split.
    """
    names = splits or SPLIT_NAMES
    sub = split_name(split, names, "image_folder")
    train_dir = root / split_name("train", names, "image_folder")
    if not root.is_dir():
        raise missing_split(root, split, "image_folder", " (data.root is not a folder)")
    if train_dir.is_dir():
        classes, class_to_idx = find_classes(str(train_dir))
        directory = root / sub
        if not directory.is_dir():
            return LabelSet(items=[], class_names=classes)
        for d in sorted(p for p in directory.iterdir() if p.is_dir()):
            if d.name not in class_to_idx:
                report(bad_row(d, f"{sub}/{d.name}", f"class folder {d.name!r} is not in "
                               f"{train_dir.name}/ (classes: {classes})",
                               "add it to train/ or remove it"))
        pairs = _files(directory, class_to_idx)
    else:
        if not 0 <= val_fraction < 1 or not 0 <= test_fraction < 1 or \
                val_fraction + test_fraction >= 1:
            raise UserError(f"image_folder: val_fraction ({val_fraction}) and test_fraction "
                             f"({test_fraction}) must be in [0, 1) with a sum < 1.")
        classes, class_to_idx = find_classes(str(root))
        pairs = []
        for k, cls in enumerate(classes):
            files = [p for p, _ in _files(root, {cls: k})]
            order = np.random.default_rng([seed, k]).permutation(len(files))
            n_val = round(val_fraction * len(files))
            n_test = round(test_fraction * len(files))
            bounds = {"val": (0, n_val), "test": (n_val, n_val + n_test),
                      "train": (n_val + n_test, len(files))}[split]
            pairs += [(files[i], k) for i in sorted(order[bounds[0]:bounds[1]])]
    items = [LabelItem(id=Path(p).relative_to(root).with_suffix("").as_posix(), path=Path(p),
                       label=label, where=f"{Path(p).parent.name}/")
             for p, label in pairs]
    return LabelSet(items=items, class_names=list(classes))
