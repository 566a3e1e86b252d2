"""The data modules of the built-in sets: generate the set into ``root``, then read it as data.

``SyntheticCaptionDataModule`` / ``SyntheticClassificationDataModule`` /
``SyntheticQADataModule`` are ``mmtf.data``'s caption, classification and question modules
plus one argument, ``synthetic`` (``{kind, **generator args}``): their ``prepare_data`` writes
the set (:func:`~mmtf.synthetic.cache.ensure_synthetic`, cached and atomic) in its real-world
layout, and from there on the format's reader of ``mmtf.data`` reads it like a downloaded
corpus. The dependency runs one way: ``mmtf.synthetic``
builds on ``mmtf.data`` (its format writers, its data modules), ``mmtf.data`` never imports it.
Why: see docs/design/synthetic-package.md
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmtf.data.datamodule import (
    CaptionDataModule,
    ClassificationDataModule,
    MediaDataModule,
    QADataModule,
    to_plain,
)
from mmtf.errors import UserError
from mmtf.synthetic.cache import SETS, ensure_synthetic, synthetic_set

# Formats that also read a set written in another: question lines carry their chat, so an
# AQA set is instruction data too.
READ_AS = {"aqa": ("instruction",)}


class _Generated(MediaDataModule):
    """Generate the built-in set ``synthetic`` into ``root`` before the splits are read."""

    def __init__(self, *, synthetic: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        spec = dict(to_plain(synthetic))
        kind = spec.get("kind")
        if kind not in SETS or self.format not in (synthetic_set(kind).format,
                                                    *READ_AS.get(synthetic_set(kind).format, ())):
            raise UserError(f"{type(self).__name__}: synthetic.kind ({kind!r}) does not write "
                            f"format {self.format!r}; kinds: "
                            f"{ {k: row.format for k, row in SETS.items()} }.")
        self.synthetic = spec

    def prepare_data(self) -> None:
        """Generate the set on first use (Lightning calls this on one process; ``items`` too)."""
        params = {k: v for k, v in self.synthetic.items() if k != "kind"}
        ensure_synthetic(self.root, self.synthetic["kind"], **params)


class SyntheticCaptionDataModule(_Generated, CaptionDataModule):
    """A built-in caption set (``audio_captions`` in Clotho's layout, ``image_captions`` in
    COCO's), generated then read by :class:`~mmtf.data.CaptionDataModule` (whose arguments it
    takes, plus ``synthetic``: ``{kind: audio_captions | image_captions, **generator args}``)."""


class SyntheticClassificationDataModule(_Generated, ClassificationDataModule):
    """A built-in label set (``audio_labels`` in ESC-50's layout, ``image_labels`` as an
    ImageFolder), generated then read by :class:`~mmtf.data.ClassificationDataModule` (whose
    arguments it takes, plus ``synthetic``: ``{kind: audio_labels | image_labels, **generator
    args}``)."""


class SyntheticQADataModule(_Generated, QADataModule):
    """The built-in audio question set (``audio_qa``, :mod:`mmtf.synthetic.aqa`), generated then
    read by :class:`~mmtf.data.datamodule.QADataModule` (whose arguments it takes, plus
    ``synthetic``: ``{kind: audio_qa, **generator args}``)."""
