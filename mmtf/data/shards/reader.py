"""Reading shards for training: members by ``(shard, offset, size)``, the stream order, the
data module (``data=shards``; the design: :mod:`mmtf.data.shards`)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from mmtf.data.datamodule import CaptionDataModule, to_plain
from mmtf.data.datasets import CaptionDataset
from mmtf.data.sampler import BucketBatchSampler, Key, refuse_other_settings
from mmtf.data.shards.index import _FIX_SHARD, INDEX_SUFFIX, ShardItem, _fs, _is_url
from mmtf.errors import ConfigError, DataError, UserError

__all__ = ["MemberReader", "ShardCaptionDataset", "ShardDataModule", "ShardStreamSampler",
           "read_member", "shuffle_buffer"]

log = logging.getLogger("mmtf.data")


class MemberReader:
    """Reads members by ``(shard, offset, size)``, keeping up to ``max_open`` shards open.

    One per process: a forked worker drops the handles it inherited (an fsspec file's buffer
    and connection belong to the parent) and opens its own. Local shards are read with
    ``os.pread`` (no shared file position); other URLs through fsspec's read-ahead cache, so
    members read in order are sequential reads.
    """

    def __init__(self, max_open: int = 16, block_size: int = 4 * 2 ** 20) -> None:
        self.max_open, self.block_size = max_open, block_size
        self._files: OrderedDict[str, Any] = OrderedDict()
        self._pid = os.getpid()

    def _open(self, url: str) -> Any:
        if not _is_url(url) or url.startswith("file://"):
            return os.open(url.removeprefix("file://"), os.O_RDONLY)
        fs, path = _fs(url)
        try:
            return fs.open(path, "rb", block_size=self.block_size, cache_type="readahead")
        except TypeError:           # a file system without block caches (memory://)
            return fs.open(path, "rb")

    def _close(self, f: Any) -> None:
        with contextlib.suppress(OSError):
            os.close(f) if isinstance(f, int) else f.close()

    def read(self, url: str, offset: int, size: int, *, where: str | None = None) -> bytes:
        """The ``size`` bytes at ``offset`` of shard ``url``.

        Raises:
            DataError: the shard is gone (``missing_file``) or shorter than the index says
                (``truncated``), naming it.
        """
        if os.getpid() != self._pid:
            self._files, self._pid = OrderedDict(), os.getpid()
        f = self._files.get(url)
        try:
            if f is None:
                f = self._files[url] = self._open(url)
                while len(self._files) > self.max_open:
                    self._close(self._files.popitem(last=False)[1])
            else:
                self._files.move_to_end(url)
            if isinstance(f, int):
                data = os.pread(f, size, offset)
            else:
                f.seek(offset)
                data = f.read(size)
        except FileNotFoundError:
            self._files.pop(url, None)
            raise DataError.make("missing_file", url, "shard not found (it was indexed before)",
                                 _FIX_SHARD, where) from None
        if len(data) != size:
            raise DataError.make("truncated", url, f"holds {len(data)} of the {size} bytes the "
                                 f"index promises at offset {offset}", "re-copy the shard, or "
                                 f"delete its {INDEX_SUFFIX} to index it again", where)
        return data


_READER = MemberReader()


def read_member(item: ShardItem) -> bytes:
    """The media bytes of one shard sample (this process's :class:`MemberReader`)."""
    return _READER.read(item.shard, item.offset, item.size, where=item.where)


# The stream's own settings that fix the order, checked on resume with the base sampler's.
_STREAM_SETTINGS = ("streams", "shuffle_buffer", "epoch_samples", "num_shards")


def _check_stream(shuffle_buffer: int, epoch_samples: int | None) -> None:
    if shuffle_buffer < 0:
        raise ConfigError(f"data.shuffle_buffer ({shuffle_buffer}) must be >= 0.")
    if epoch_samples is not None and (isinstance(epoch_samples, bool) or epoch_samples < 1):
        raise ConfigError(f"data.epoch_samples ({epoch_samples!r}) must be >= 1, or null for "
                          f"one pass over the shards.")


def _split_sizes(n: int, parts: int) -> list[int]:
    """``n`` cut into ``parts`` contiguous runs whose sizes differ by at most 1."""
    return [n // parts + (1 if k < n % parts else 0) for k in range(parts)]


def shuffle_buffer(stream: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """WebDataset's shuffle: fill a buffer of ``size``, then emit a random element of it and
    put the next one in its place; at the end emit what is left in random order.

    Args:
        stream: positions in stream order (n,).
        size: the buffer size; <= 1 keeps the order.
        rng: the draws.

    Returns:
        The positions in emitted order (n,): a permutation of ``stream``.
    """
    n = len(stream)
    if size <= 1 or n <= 1:
        return stream.copy()
    if n <= size:
        return stream[rng.permutation(n)]
    buf = stream[:size].copy()
    out = np.empty(n, dtype=stream.dtype)
    picks = rng.integers(0, size, n - size)
    for k, (j, incoming) in enumerate(zip(picks.tolist(), stream[size:].tolist())):
        out[k] = buf[j]
        buf[j] = incoming
    out[n - size:] = buf[rng.permutation(size)]
    return out


class ShardStreamSampler(BucketBatchSampler):
    """Batches of ``(item, caption, epoch)`` keys in shard-stream order.

    Per pass: shards permuted by ``(seed, pass)``, their samples cut into a run per rank and
    per *stream* (loader worker), each run buffer-shuffled, batched by the shared code, and the
    streams' batches dealt in turn so worker ``w`` reads only stream ``w``'s shards (no further
    batch shuffle). ``epoch_samples`` cuts epochs out of the endless sequence of passes.

    Args:
        shard_of: the shard number of every item; items come shard by shard (non-decreasing).
        streams: streams per rank (the loader's ``num_workers``, at least 1).
        shuffle_buffer: samples in each stream's shuffle buffer (0 or 1: stream order).
        epoch_samples: examples per epoch over all ranks; None = one pass over the data.
        **kwargs: see :class:`~mmtf.data.sampler.BucketBatchSampler`.
    """

    def __init__(self, *, shard_of: Sequence[int], streams: int = 1, shuffle_buffer: int = 1000,
                 epoch_samples: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        name = type(self).__name__
        shard_of = np.asarray(shard_of, dtype=np.int64)
        if len(shard_of) != len(self.lengths) or (np.diff(shard_of) < 0).any():
            raise ValueError(f"{name}: shard_of must give a non-decreasing shard number for "
                             f"each of the {len(self.lengths)} items.")
        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise UserError(f"{name}: streams ({streams!r}) must be a positive int.")
        _check_stream(shuffle_buffer, epoch_samples)
        self.shard_starts = np.flatnonzero(np.r_[True, np.diff(shard_of) != 0])
        self.streams, self.shuffle_buffer = streams, int(shuffle_buffer)
        self.epoch_samples = None if epoch_samples is None else int(epoch_samples)
        if self._pass_rank_size() < streams:
            raise UserError(f"{name}: {super().num_examples()} examples cannot fill "
                            f"{self.num_replicas} rank(s) x {streams} stream(s); use fewer "
                            f"data.loader.num_workers (streams) or more data.")
        self._passes: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self._batches: tuple[int, list[list[Key]]] | None = None

    # ------------------------------------------------------------------ sizes
    def num_examples(self) -> int:
        """Examples per epoch over all ranks (``epoch_samples``, else one pass)."""
        return self.epoch_samples or super().num_examples()

    def _pass_rank_size(self) -> int:
        """Examples of one pass per rank (the base's ``_rank_size`` of one pass)."""
        n = super().num_examples()
        return n // self.num_replicas if self.drop_last else math.ceil(n / self.num_replicas)

    def _stream_sizes(self) -> list[int]:
        """Examples of each stream of this rank per epoch."""
        return _split_sizes(self._rank_size(), self.streams)

    def __len__(self) -> int:
        # Counted on the epoch's batches, not by formula: exact whatever _cut does (fixed
        # batch sizes or a duration budget), and the batches are kept for the walk anyway.
        return len(self.batches())

    # ------------------------------------------------------------------ order
    def _pass(self, p: int, rank: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``rank``'s streams of pass ``p``: (items, caps, place in the stream) per stream,
        buffer-shuffled."""
        if (p, rank) in self._passes:
            return self._passes[(p, rank)]
        perm = (np.random.default_rng([self.seed, p, 4]).permutation(len(self.shard_starts))
                if self.shuffle else np.arange(len(self.shard_starts)))
        # The base's examples of "epoch" p (item-major: captions drawn per item, the same
        # whatever its place), taken shard by shard in the permuted order.
        items, caps = self._examples(p)
        bounds = np.searchsorted(items, np.r_[self.shard_starts, len(self.lengths)])
        pos = np.concatenate([np.arange(bounds[s], bounds[s + 1]) for s in perm])
        items, caps = items[pos], caps[pos]
        size = self._pass_rank_size()
        order = np.arange(len(items))
        if size * self.num_replicas > len(order):  # the short ranks repeat the pass's start
            order = np.resize(order, size * self.num_replicas)
        mine = order[rank * size:(rank + 1) * size]
        out, start = [], 0
        for s, k in enumerate(_split_sizes(size, self.streams)):
            run = mine[start:start + k]
            start += k
            at = np.arange(k)           # emitted order -> place in the stream (what is read)
            if self.shuffle:
                rng = np.random.default_rng([self.seed, p, 5, rank, s])
                at = shuffle_buffer(at, self.shuffle_buffer, rng)
            out.append((items[run[at]], caps[run[at]], at))
        if len(self._passes) >= 3 * self.num_replicas:
            self._passes.pop(min(self._passes))
        self._passes[(p, rank)] = out
        return out

    def _stream_epoch(self, s: int, want: int, epoch: int,
                      rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stream ``s``'s examples of ``epoch``: positions ``[epoch * want, (epoch + 1) *
        want)`` of the endless sequence of its passes, and each one's place in the stream
        (what is read: ``pass * pass length + place in the pass``)."""
        length = _split_sizes(self._pass_rank_size(), self.streams)[s]
        begin = epoch * want
        parts: list[tuple[np.ndarray, ...]] = []
        while want > 0:
            p, at = divmod(begin, length)
            take = min(want, length - at)
            parts.append(tuple(a[at:at + take] for a in self._pass(p, rank)[s]))
            parts[-1] = (*parts[-1][:2], parts[-1][2] + p * length)
            begin, want = begin + take, want - take
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return tuple(np.concatenate(a) for a in zip(*parts))  # type: ignore[return-value]

    def rank_examples(self, epoch: int, rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``rank``'s (default: this sampler's) examples of ``epoch``: its streams' runs, one
        after the other."""
        rank = self.rank if rank is None else rank
        runs = [self._stream_epoch(s, want, epoch, rank)[:2]
                for s, want in enumerate(self._stream_sizes())]
        return np.concatenate([r[0] for r in runs]), np.concatenate([r[1] for r in runs])

    def _cut(self, items: np.ndarray, caps: np.ndarray, epoch: int, scale: int = 1,
             sort: bool | None = None) -> list[list[Key]]:
        """Each stream cut by the shared code, then the streams' batches dealt in turn."""
        sizes = self._stream_sizes()
        if len(items) != sum(sizes):
            return super()._cut(items, caps, epoch, scale, sort)
        per_stream, start = [], 0
        for n in sizes:
            per_stream.append(super()._cut(items[start:start + n], caps[start:start + n], epoch,
                                           scale, sort))
            start += n
        out: list[list[Key]] = []
        for k in range(max(len(b) for b in per_stream)):
            out += [b[k] for b in per_stream if k < len(b)]
        return out

    def batches(self, epoch: int | None = None) -> list[list[Key]]:
        """This rank's batches of one epoch (default: the current one); the last epoch's are
        kept (``__len__``, the padding report and the walk ask for the same epoch)."""
        epoch = self.state.epoch if epoch is None else int(epoch)
        if self._batches is None or self._batches[0] != epoch:
            self._batches = (epoch, super().batches(epoch))
        return self._batches[1]

    def _order_batches(self, batches: list[list[Key]], epoch: int) -> list[list[Key]]:
        """Kept as dealt: stream ``w``'s batches reach loader worker ``w``."""
        return batches

    # ------------------------------------------------------------------ reading
    def __iter__(self) -> Iterator[list[Key]]:
        """The base's batches, the first key of each extended by the items to read into the
        reading process's buffer before it (:meth:`fills`; read by :class:`ShardCaptionDataset`)."""
        fills: list[list[int]] | None = None
        for batch in super().__iter__():
            k = self.state.position - 1
            if fills is None:
                fills = self.fills(self.state.epoch, k)
            yield [(*batch[0], tuple(fills[k])), *batch[1:]] if fills[k] else batch

    def fills(self, epoch: int, start: int = 0) -> list[list[int]]:
        """Per batch of ``epoch``, the items read into its reader's buffer first: the stream's
        next items up to the last one the batch needs (worker ``w`` reads batches ``w, w + W,
        ...``, stream ``w``'s), so each shard is read front to back once. The batch at ``start``
        (a resume) also gets what the buffer held there, a function of ``(epoch, position)``."""
        batches = self.batches(epoch)
        out: list[list[int]] = [[] for _ in batches]
        for w, want in enumerate(self._stream_sizes()):
            items, _, place = self._stream_epoch(w, want, epoch, self.rank)
            stream = items[np.argsort(place, kind="stable")].tolist()
            ahead, held, q, first = Counter(stream), Counter(), 0, True
            for k in range(w, len(batches), self.streams):
                if k >= start and first:               # the first batch read: the buffer
                    first, left = False, held.copy()
                    for x in stream[:q]:
                        if left[x] > 0:
                            left[x] -= 1
                            out[k].append(x)
                begin = q
                for item, *_ in batches[k]:
                    if held[item]:
                        held[item] -= 1
                    elif ahead[item]:                  # else not this stream's: read alone
                        while stream[q] != item:
                            held[stream[q]] += 1
                            ahead[stream[q]] -= 1
                            q += 1
                        ahead[item] -= 1
                        q += 1
                if k >= start:
                    out[k] += stream[begin:q]
        return out

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "streams": self.streams,
                "shuffle_buffer": self.shuffle_buffer, "epoch_samples": self.epoch_samples,
                "num_shards": len(self.shard_starts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        refuse_other_settings(self, state, _STREAM_SETTINGS,
                              "the same shards, data.loader.num_workers (= streams per rank), "
                              "data.shuffle_buffer and data.epoch_samples")
        super().load_state_dict(state)


class ShardCaptionDataset(CaptionDataset):
    """:class:`~mmtf.data.datasets.CaptionDataset` over shard samples. A key may carry the
    items to read first (:meth:`ShardStreamSampler.fills`): they are read with one ranged read
    per run of one shard into this process's buffer, and served from it; any other item (the
    data check, evaluation, a skipped item's replacement) is read alone by
    ``(shard, offset, size)`` (:func:`read_member`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[int, list[bytes]] = {}
        self._held_epoch: int | None = None

    def _fill(self, fill: Sequence[int]) -> None:
        k = 0
        while k < len(fill):
            end = k + 1
            while end < len(fill) and self.items[fill[end]].shard == self.items[fill[k]].shard:
                end += 1
            run = [self.items[i] for i in fill[k:end]]
            lo, hi = min(i.offset for i in run), max(i.offset + i.size for i in run)
            try:
                data = _READER.read(run[0].shard, lo, hi - lo, where=run[0].where)
            except DataError:       # each item then fails (or is skipped) on its own
                data = None
            for i, item in zip(fill[k:end], run):
                if data is not None:
                    self._held.setdefault(i, []).append(
                        data[item.offset - lo:item.offset - lo + item.size])
            k = end

    def __getitem__(self, key: Any) -> dict[str, Any]:
        if isinstance(key, tuple):
            if key[2] != self._held_epoch:  # an epoch's first batch refills the whole buffer
                self._held, self._held_epoch = {}, key[2]
            if len(key) > 3:
                self._fill(key[3])
                key = key[:3]
        held = len(self._held.get(key if isinstance(key, int) else key[0], ()))
        out = super().__getitem__(key)
        index = key if isinstance(key, int) else key[0]
        if held and len(self._held.get(index, ())) == held:    # served without reading
            self.read_bytes(index)
        return out

    def read_bytes(self, index: int) -> bytes:
        held = self._held.get(index)
        if not held:
            return read_member(self.items[index])
        data = held.pop()
        if not held:
            del self._held[index]
        return data


class ShardDataModule(CaptionDataModule):
    """Captioning data from WebDataset-convention tar shards (``data=shards``).

    Besides :class:`~mmtf.data.CaptionDataModule`'s arguments (``format`` is ``shards``;
    ``root`` is what relative shard paths resolve against):

    Args:
        shards: ``{train: ..., val: ..., test: ...}``, each a brace pattern
            (``{000000..000127}.tar``), a glob, a list of either, or fsspec URLs.
        shuffle_buffer: training samples per stream in the shuffle buffer (memory: keys only).
        epoch_samples: training examples per epoch (all ranks); null = one pass over the shards.
        index_cache: where indexes of shards without a writable folder are cached (null:
            ``$MMTF_CACHE_DIR`` or ``~/.cache/mmtf``, ``shard-index/``).
        **kwargs: see :class:`~mmtf.data.CaptionDataModule`.
    """

    def __init__(self, *, shards: Mapping[str, Any], shuffle_buffer: int = 1000,
                 epoch_samples: int | None = None, index_cache: str | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("format", "shards")
        kwargs.setdefault("modality", "audio")
        if kwargs["format"] != "shards":
            raise ConfigError(f"ShardDataModule reads format 'shards', not "
                              f"{kwargs['format']!r}; remove data.format.")
        super().__init__(**kwargs)
        shards = to_plain(shards)
        if not isinstance(shards, Mapping) or not shards:
            raise ConfigError(f"data.shards ({shards!r}) must map splits to shard patterns, "
                              f"e.g. {{train: 'train/*.tar', val: 'val/*.tar'}}.")
        unknown = sorted(set(shards) - {"train", "val", "test"})
        if unknown:
            raise ConfigError(f"data.shards has unknown split(s) {unknown}; use train, val, test.")
        _check_stream(shuffle_buffer, epoch_samples)
        self.shards = dict(shards)
        self.shuffle_buffer, self.epoch_samples = shuffle_buffer, epoch_samples
        self.index_cache = index_cache

    def _reader_kwargs(self) -> dict[str, Any]:
        return {"shards": self.shards, "modality": self.modality,
                "index_cache": self.index_cache}

    def _probe(self, raw: list) -> tuple[list, list[float]]:
        """Durations and channel counts come from the index: nothing is read here."""
        kept, durations = [], []
        for item in raw:
            if self.channels is not None and item.channels not in (None, self.channels):
                self.policy(DataError.make(
                    "channels", item.shard, f"sample has {item.channels} channel(s) but "
                    f"data.channels={self.channels}", "set data.channels=null to mix any "
                    "channel count down to mono", item.where))
                continue
            kept.append(item)
            durations.append(item.duration)
        return kept, durations

    def _image_sizes(self, split: str) -> list[tuple[int, int]]:
        """From the index: no member is read."""
        return [item.image_size for item in self.items(split)]

    def _sampler(self, split: str, **kwargs: Any) -> BucketBatchSampler:
        if split != "train":
            return super()._sampler(split, **kwargs)
        items: list[ShardItem] = self.items("train")
        shard_of = np.cumsum([i > 0 and item.shard != items[i - 1].shard
                              for i, item in enumerate(items)]).tolist()
        return ShardStreamSampler(shard_of=shard_of, streams=max(1, self.num_workers),
                                  shuffle_buffer=self.shuffle_buffer,
                                  epoch_samples=self.epoch_samples, **kwargs)

    def _loader(self, split: str) -> Any:
        loader = super()._loader(split)
        if split == "train":
            s = loader.batch_sampler
            log.info("[data] shards train: %d shards over %d rank(s) x %d stream(s), shuffle "
                     "buffer %d, epoch = %d examples (%s), %d batches per rank",
                     len(s.shard_starts), s.num_replicas, s.streams, s.shuffle_buffer,
                     s.num_examples(), "epoch_samples" if s.epoch_samples else "one pass",
                     len(s))
        return loader

    def _dataset(self, split: str, crop: str) -> ShardCaptionDataset:
        return ShardCaptionDataset(self.items(split), tokens=self.tokens(split),
                                   captions_per_item=self.captions_per_item
                                   if split == "train" else 1,
                                   **self._media_kwargs(split, crop))
