"""The built-in datasets: generated once into a cache folder, then read like real data.

``ensure_synthetic(root, kind, **params)`` writes a set in its real-world layout unless ``root``
holds the same one (a hash of kind, generator version and params in ``root/.mmtf_synthetic.json``).
Writing is atomic (a temporary folder renamed into place: racing ranks are safe). Every kind is a
row of :data:`SETS`: writer, version, format and caption parser (:func:`caption_parser`)."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from mmtf.errors import DataError, UserError
from mmtf.synthetic import aqa, audio, image

log = logging.getLogger(__name__)

MARKER = ".mmtf_synthetic.json"


class SyntheticSet(NamedTuple):
    """One built-in set: how it is written and what reads it."""

    writer: Callable[..., None]
    version: int                                   # bump when the written bytes change
    format: str                                    # the mmtf.data format it is written in
    caption_parser: Callable[[str], Any] | None    # caption -> event sequence; None: labels


# The built-in sets by name (``data.synthetic.kind``).
SETS: dict[str, SyntheticSet] = {
    "audio_captions": SyntheticSet(audio.write_caption_set, audio.VERSION, "clotho",
                                   audio.parse_caption),
    "audio_labels": SyntheticSet(audio.write_label_set, audio.VERSION, "esc50", None),
    "audio_qa": SyntheticSet(aqa.write_qa_set, aqa.VERSION, "aqa", None),
    "image_captions": SyntheticSet(image.write_caption_set, image.VERSION, "coco",
                                   image.parse_caption),
    "image_labels": SyntheticSet(image.write_label_set, image.VERSION, "image_folder", None),
}
_NOT_HASHED = {"num_workers"}  # does not change the output


def synthetic_set(kind: str) -> SyntheticSet:
    """The row of :data:`SETS` named ``kind``.

    Raises:
        UserError: ``kind`` is not a built-in set.
    """
    if kind not in SETS:
        raise UserError(f"synthetic kind ({kind!r}) must be one of {sorted(SETS)}; "
                        f"check data.synthetic.kind.")
    return SETS[kind]


def caption_parser(name: str | None) -> Callable[[str], Any] | None:
    """The caption -> event sequence parser of the data set called ``name``.

    The metric code looks it up by the data set's name (``data.synthetic.kind`` of the run);
    None for a label set, for real data and for no name: those have no event accuracy."""
    row = SETS.get(name) if name is not None else None
    return row.caption_parser if row is not None else None


def full_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the writer's defaults filled in (so equal sets hash equal)."""
    writer = synthetic_set(kind).writer
    sig = inspect.signature(writer)
    accepted = [n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise UserError(f"data.synthetic: {unknown} not understood by the {kind!r} generator; "
                         f"it takes {accepted}.")
    defaults = {n: sig.parameters[n].default for n in accepted}
    return {**defaults, **params}


def config_hash(kind: str, params: dict[str, Any]) -> str:
    """Identity of a generated set: kind, generator version and the output-changing params."""
    version = synthetic_set(kind).version
    params = full_params(kind, params)
    payload = {"kind": kind, "version": version,
               "params": {k: v for k, v in sorted(params.items()) if k not in _NOT_HASHED}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=list).encode()).hexdigest()[:16]


def _marker_hash(root: Path) -> str | None:
    try:
        return json.loads((root / MARKER).read_text())["hash"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ensure_synthetic(root: str | os.PathLike, kind: str, **params: Any) -> Path:
    """Make sure ``root`` holds the synthetic set ``kind`` generated with ``params``; return
    ``root`` as an absolute path.

    Args:
        root, kind: the set's folder (created, or replaced if it holds another synthetic set);
            ``audio_captions`` | ``audio_labels`` | ``audio_qa`` | ``image_captions`` |
            ``image_labels``.
        **params: the writer's keyword arguments (sizes, seed, ...).

    Raises:
        DataError: ``root`` is not empty and was not written here (it is never overwritten).
    """
    writer, version = synthetic_set(kind)[:2]
    root = Path(root).expanduser().resolve()
    params = full_params(kind, params)
    want = config_hash(kind, params)
    if _marker_hash(root) == want:
        return root
    if root.is_dir() and not (root / MARKER).exists() and any(root.iterdir()):
        raise DataError.make(
            "bad_root", root, f"holds files but no {MARKER}, so it is not an mmtf synthetic "
            f"set and will not be overwritten", "point data.root (or paths.data_dir / "
            "MMTF_DATA_DIR) at an empty or new folder", skippable=False)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    log.info("Generating the synthetic %s set into %s (first use or changed config)", kind, root)
    t0 = time.perf_counter()
    try:
        writer(tmp, **params)
        seconds = time.perf_counter() - t0
        meta = {"kind": kind, "version": version, "hash": want, "seconds": round(seconds, 2),
                "params": {k: v for k, v in params.items() if k not in _NOT_HASHED}}
        (tmp / MARKER).write_text(json.dumps(meta, indent=2, default=list))
        _install(tmp, root, want)
        log.info("Synthetic %s set ready in %.1f s: %s", kind, seconds, root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _install(tmp: Path, root: Path, want: str) -> None:
    """Rename ``tmp`` to ``root``; if another process got there first with the same set, keep
    theirs; if ``root`` holds a stale set, move it aside and retry."""
    for _ in range(10):
        try:
            os.rename(tmp, root)  # atomic; fails if root is a non-empty folder
            return
        except OSError:
            if _marker_hash(root) == want:
                return  # a racing process installed the same set
            trash = root.parent / f".{root.name}.old-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(root, trash)
            except FileNotFoundError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
    raise OSError(f"could not install the synthetic set at {root}; is another process "
                  f"rewriting it with a different config?")

