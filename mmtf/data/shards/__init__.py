"""WebDataset-convention tar shards (``data=shards``): one index, one reader, one writer.

A shard is an uncompressed tar of samples grouped by key (the member name up to the first dot
of its file name): a media member (``.wav .flac .mp3 .ogg .opus``; ``.png .jpg .jpeg .webp``)
and ``<key>.json`` (``captions`` / ``caption`` / ``text``, optional ``id``, ``language``,
``task``) or ``<key>.txt`` (one caption). Shards are named by brace patterns
(``/data/wavcaps/{000000..000127}.tar``), globs or lists, relative to ``data.root``, or fsspec
URLs.

* :mod:`~mmtf.data.shards.index`: the format; every shard is read through its index.
* :mod:`~mmtf.data.shards.reader`: members by ``(shard, offset, size)``, the stream order,
  :class:`ShardDataModule`.
* :mod:`~mmtf.data.shards.writer`: :func:`write_shards`, ``python -m mmtf.data.shard``.

The names below load on first use: :mod:`mmtf.data.formats` registers the index's reader, and
the data module is built on :mod:`mmtf.data.datamodule`, which imports the formats. Why
indexed shards: docs/design/shards.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    **dict.fromkeys(["INDEX_SUFFIX", "ShardItem", "expand_braces", "load_index", "read_shards",
                     "scan_shard", "shard_urls"], "index"),
    **dict.fromkeys(["MemberReader", "ShardCaptionDataset", "ShardDataModule",
                     "ShardStreamSampler", "read_member", "shuffle_buffer"], "reader"),
    **dict.fromkeys(["shard_dataset", "write_shards"], "writer"),
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
