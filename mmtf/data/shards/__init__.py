"""WebDataset-convention tar shards (``data=shards``): one index, one reader, one writer.

A shard is an uncompressed tar of samples grouped by key: a media member and ``<key>.json``
(``captions`` / ``caption`` / ``text``, optional ``id``, ``language``, ``task``) or
``<key>.txt``. Shards are named by brace patterns, globs, lists or fsspec URLs.
:mod:`~mmtf.data.shards.index` (the format), :mod:`~mmtf.data.shards.reader` (reading,
:class:`ShardDataModule`), :mod:`~mmtf.data.shards.writer` (:func:`write_shards`). Names load on
first use. Why indexed shards: docs/design/shards.md."""

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
