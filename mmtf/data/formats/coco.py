"""COCO captions (Chen et al., 2015): image captioning, about 5 captions per image.

Layout::

    root/annotations/captions_<name>.json   {"images": [{"id", "file_name", ...}],
                                             "annotations": [{"image_id", "id", "caption"}]}
    root/<name>/<file_name>                 the images

``<name>`` per split comes from ``data.splits`` (COCO 2017's test images have no public
captions: ``coco_captions`` evaluates on val2017 unless ``data.splits.test`` is set)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from mmtf.data.formats.base import (
    CaptionItem,
    Report,
    bad_row,
    clean_captions,
    require_index,
    split_name,
)
from mmtf.errors import DataError

SPLIT_NAMES = {"train": "train", "val": "val", "test": "test"}


def json_path(root: Path, name: str) -> Path:
    """The captions JSON of one split."""
    return root / "annotations" / f"captions_{name}.json"


def _load(index: Path) -> dict:
    try:
        with open(index, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError.make("bad_row", index, f"is not valid JSON ({e})",
                             "re-export the annotation file", skippable=False) from None
    absent = [k for k in ("images", "annotations") if not isinstance(data, dict) or k not in data]
    if absent:
        raise DataError.make("missing_columns", index, f"COCO JSON has no {absent} key(s)",
                             'it must be {"images": [...], "annotations": [...]}',
                             skippable=False)
    not_lists = [k for k in ("images", "annotations") if not isinstance(data[k], list)]
    if not_lists:
        raise DataError.make("missing_columns", index, f"COCO JSON key(s) {not_lists} are not "
                             f"lists", 'it must be {"images": [...], "annotations": [...]}',
                             skippable=False)
    return data


def read_coco(root: Path, split: str, *, report: Report,
              splits: Mapping[str, str] | None = None) -> list[CaptionItem]:
    """One split of a COCO-captions dataset: an item per captioned image, in ``images`` order.

    ``splits``: our split -> COCO name (default train / val / test)."""
    name = split_name(split, splits or SPLIT_NAMES, "coco")
    index = json_path(root, name)
    require_index(index, split, "coco", f" (expected annotations/captions_{name}.json)")
    data = _load(index)
    image_dir = root / name
    images: dict[object, tuple[str, str]] = {}
    for i, img in enumerate(data["images"]):
        where = f"{index.name} images[{i}]"
        if (not isinstance(img, dict) or not isinstance(img.get("id"), (int, str))
                or not img.get("file_name")):
            report(bad_row(index, where, "image entry needs 'id' and 'file_name'",
                           "fix or delete the entry"))
            continue
        images[img["id"]] = (str(img["file_name"]), where)
    captions: dict[object, list[str]] = {k: [] for k in images}
    for i, ann in enumerate(data["annotations"]):
        where = f"{index.name} annotations[{i}]"
        if (not isinstance(ann, dict) or not isinstance(ann.get("image_id"), (int, str))
                or "caption" not in ann):
            report(bad_row(index, where, "annotation needs 'image_id' and 'caption'",
                           "fix or delete the entry"))
            continue
        if ann["image_id"] not in captions:
            report(bad_row(index, where, f"image_id {ann['image_id']!r} is not in 'images'",
                           "add the image or delete the annotation"))
            continue
        text = clean_captions([ann["caption"]], index, where, report, ["caption"])
        captions[ann["image_id"]].extend(text)
    items = []
    for image_id, (file_name, where) in images.items():
        if not captions[image_id]:
            report(DataError.make("empty_caption", index, f"image {image_id} ({file_name}) has "
                                  f"no captions", "add captions or delete the image", where))
            continue
        items.append(CaptionItem(id=str(image_id), path=image_dir / file_name,
                                 captions=tuple(captions[image_id]), where=where))
    return items


def write_coco_json(root: Path, name: str,
                    entries: Sequence[tuple[int, str, Sequence[str], int, int]]) -> Path:
    """Write ``annotations/captions_<name>.json`` of ``entries``, ``(image_id, file_name,
    captions, width, height)`` per image."""
    images, annotations = [], []
    for image_id, file_name, caps, width, height in entries:
        images.append({"id": image_id, "file_name": file_name, "width": width, "height": height})
        for cap in caps:
            annotations.append({"image_id": image_id, "id": len(annotations), "caption": cap})
    path = json_path(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"info": {"description": "mmtf synthetic shapes"}, "licenses": [],
               "images": images, "annotations": annotations}
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path
