"""An in-memory fsspec file system (``countmem://``) that counts what an object store bills:
every ranged fetch is one request; bytes read, and fetches behind the previous one of a file.
Used by tests/unit/data/test_shards.py and experiments/data_throughput/shard_reads.py."""

from __future__ import annotations

import fsspec
import fsspec.implementations.memory
import fsspec.spec


class CountingFile(fsspec.spec.AbstractBufferedFile):
    """An object-store file: every ``_fetch_range`` is one request."""

    def __init__(self, fs, path, data: bytes, **kw):
        self.data = data
        super().__init__(fs, path, size=len(data), **kw)

    def _fetch_range(self, start: int, end: int) -> bytes:
        fs = self.fs
        fs.requests += 1
        fs.bytes_read += min(end, len(self.data)) - start
        fs.backward += start < fs.ends.get(self.path, 0)     # a fetch behind the last one
        fs.ends[self.path] = end
        return self.data[start:end]


class CountingMemory(fsspec.implementations.memory.MemoryFileSystem):
    protocol = "countmem"
    store: dict = {}    # its own store, not memory://'s
    pseudo_dirs = [""]
    requests = bytes_read = backward = 0
    ends: dict = {}

    def reset(self):
        self.requests = self.bytes_read = self.backward = 0
        self.ends = {}

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("countmem://"))

    def _open(self, path, mode="rb", **kw):
        if mode != "rb":
            return super()._open(path, mode, **kw)
        path = self._strip_protocol(path)
        if path not in self.store:
            raise FileNotFoundError(path)
        return CountingFile(self, path, self.store[path].getvalue(), mode=mode,
                             **{k: v for k, v in kw.items() if k in ("block_size", "cache_type")})
