"""Reading shards for training: members by ``(shard, offset, size)``, the stream order, the
data module (``data=shards``; the design: :mod:`mmtf.data.shards`)."""

from __future__ import annotations

import bisect
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
from mmtf.data.sampler import BucketBatchSampler, Key, _merge, _pack, _split, refuse_other_settings
from mmtf.data.shards.index import _FIX_SHARD, INDEX_SUFFIX, ShardItem, _fs, _is_url
from mmtf.errors import ConfigError, DataError, UserError

__all__ = ["MemberReader", "ShardCaptionDataset", "ShardDataModule", "ShardStreamSampler",
           "bucket_buffer", "read_member", "shuffle_buffer"]

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
# The shard batch order's rule; 2: batches bucketed inside the shuffle buffer. A mid-epoch
# position saved under another rule cannot be continued exactly.
STREAM_ORDER = 2


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


def bucket_buffer(lengths: np.ndarray, size: int, rng: np.random.Generator | None, *,
                  batch_size: int | None = None, budget: float | None = None) -> list[np.ndarray]:
    """Length-bucketed batches drawn from a shuffle buffer over a stream: fill the buffer to
    ``size`` items, pick a seed item (uniformly, like WebDataset's shuffle; ``rng`` None: the
    oldest), take as batch the seed and its neighbours by length in the buffer (with
    ``batch_size`` the seed's cell of the length-sorted buffer cut every ``batch_size`` from
    the shortest, or by the budget's greedy cut from the shortest; the top cell filled from
    below), remove it, refill, until the stream and the buffer are empty. Removing a cell
    leaves the others as they were, so the drain at the stream's end (no refills) cuts what
    is left like one sorted pool. Items never wait outside the buffer: the reader holds at most
    ``size`` of them, each read once, in stream order.

    Args:
        lengths: each item's length, in stream (read) order (n,).
        size: the buffer's capacity in items (>= 1).
        rng: the draws; None picks the oldest item of the buffer (no shuffle).
        batch_size: items per batch; or None with ``budget``: items x the longest <= budget
            (an item over it is a batch alone; a batch bigger than the buffer is what the
            buffer holds: every step takes at least the seed, so the loop ends).

    Returns:
        The batches in emitted order, each an array of stream positions sorted by length;
        only the last one (the buffer's drain) may be short of ``batch_size``.
    """
    if (batch_size is None) == (budget is None):
        raise ValueError("bucket_buffer: give batch_size or budget, not both")
    size = max(1, int(size))
    n = len(lengths)
    order = lengths.tolist()
    buf: list[tuple[float, int]] = []          # (length, position), sorted: the buffer
    out: list[np.ndarray] = []
    picks = iter(rng.random(n).tolist()) if rng is not None else None
    q = 0

    while True:
        while q < n and len(buf) < size:
            bisect.insort(buf, (order[q], q))
            q += 1
        if not buf:
            return out
        if picks is None:
            j = min(range(len(buf)), key=lambda i: buf[i][1])
        else:                   # one draw per batch; n draws cover the most batches possible
            j = min(int(next(picks) * len(buf)), len(buf) - 1)
        if budget is None:
            # the top cell, short of batch_size, taken as the top batch_size
            lo = min(j // batch_size * batch_size, max(0, len(buf) - batch_size))
            hi = min(lo + batch_size, len(buf))
        else:                   # the same with the budget's greedy cut from the shortest
            lo = hi = 0
            while hi <= j:
                lo, hi = hi, hi + 1
                while hi < len(buf) and (hi - lo + 1) * buf[hi][0] <= budget:
                    hi += 1
            while hi == len(buf) and lo > 0 and (hi - lo + 1) * buf[-1][0] <= budget:
                lo -= 1                 # the top cell, filled from below
        out.append(np.fromiter((p for _, p in buf[lo:hi]), np.int64, hi - lo))
        del buf[lo:hi]


class ShardStreamSampler(BucketBatchSampler):
    """Batches of ``(item, caption, epoch)`` keys in shard-stream order.

    Per pass: shards permuted by ``(seed, pass)``, their samples cut into a run per rank and
    per *stream* (loader worker). ``epoch_samples`` cuts each stream's epochs out of the
    endless sequence of its passes. Each stream's epoch goes through its shuffle buffer, which
    emits length-bucketed batches drawn from what it holds (:func:`bucket_buffer`; without
    bucketing WebDataset's shuffle, then consecutive batches), and the streams' batches are
    dealt in turn so worker ``w`` reads only stream ``w``'s shards (no further batch shuffle).

    Args:
        shard_of: the shard number of every item; items come shard by shard (non-decreasing).
        streams: streams per rank (the loader's ``num_workers``, at least 1).
        shuffle_buffer: samples in each stream's shuffle buffer (0 or 1: stream order); it
            holds at least one batch (:meth:`buffer_size`).
        epoch_samples: examples per epoch over all ranks; None = one pass over the data.
        **kwargs: see :class:`~mmtf.data.sampler.BucketBatchSampler` (its ``bucket_size``
            does not apply: the buffer is the sorting pool).
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
        self._passes: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray]]] = {}
        self._stream_cache: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray,
                                                             list[np.ndarray]]]] = {}
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
    def _pass(self, p: int, rank: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """``rank``'s streams of pass ``p``: (items, caps) per stream, in stream (read) order."""
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
        for k in _split_sizes(size, self.streams):
            run = mine[start:start + k]
            start += k
            out.append((items[run], caps[run]))
        if len(self._passes) >= 3 * self.num_replicas:
            self._passes.pop(min(self._passes))
        self._passes[(p, rank)] = out
        return out

    def _read_order(self, s: int, want: int, epoch: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Stream ``s``'s (items, caps) of ``epoch`` in read order: positions ``[epoch * want,
        (epoch + 1) * want)`` of the endless sequence of its passes."""
        length = _split_sizes(self._pass_rank_size(), self.streams)[s]
        begin = epoch * want
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        while want > 0:
            p, at = divmod(begin, length)
            take = min(want, length - at)
            items, caps = self._pass(p, rank)[s]
            parts.append((items[at:at + take], caps[at:at + take]))
            begin, want = begin + take, want - take
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate([a for a, _ in parts]), np.concatenate([c for _, c in parts])

    def buffer_size(self) -> int:
        """Items each stream's buffer holds: ``shuffle_buffer``, at least one batch (a batch
        is drawn from the buffer; with a budget, as many items of the mean length as fit)."""
        return max(self.shuffle_buffer, self._per_batch())

    def _streams_of(self, epoch: int, rank: int) -> list[tuple[np.ndarray, np.ndarray,
                                                              list[np.ndarray]]]:
        """``rank``'s streams of ``epoch``: (items, caps) in read order and the batches (stream
        positions) its buffer emits, before the batch count is fitted. The buffer starts
        empty at the epoch's start and is drained at its end, so an epoch is computed alone."""
        if (epoch, rank) in self._stream_cache:
            return self._stream_cache[(epoch, rank)]
        out = []
        for s, want in enumerate(self._stream_sizes()):
            items, caps = self._read_order(s, want, epoch, rank)
            rng = (np.random.default_rng([self.seed, epoch, 5, rank, s])
                   if self.shuffle and self.shuffle_buffer > 1 else None)
            lengths = self.lengths[items]
            if self.bucketing:
                batches = bucket_buffer(lengths, self.buffer_size(), rng,
                                        batch_size=self.batch_size, budget=self.budget)
            else:       # WebDataset's shuffle, then consecutive batches of the emitted order
                at = (shuffle_buffer(np.arange(len(items)), self.shuffle_buffer, rng)
                      if rng is not None else np.arange(len(items)))
                bounds = (_pack(lengths[at], self.budget) if self.budget is not None else
                          [(b, b + self.batch_size) for b in range(0, len(at), self.batch_size)])
                batches = [at[lo:hi] for lo, hi in bounds]
            out.append((items, caps, batches))
        if len(self._stream_cache) >= 2 * self.num_replicas:
            self._stream_cache.pop(next(iter(self._stream_cache)))
        self._stream_cache[(epoch, rank)] = out
        return out

    def rank_examples(self, epoch: int, rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``rank``'s (default: this sampler's) examples of ``epoch`` in emitted order (its
        streams' batches, stream after stream; ``_rank_size()`` long)."""
        rank = self.rank if rank is None else rank
        streams = self._streams_of(epoch, rank)
        at = [np.concatenate(b) if b else np.zeros(0, np.int64) for _, _, b in streams]
        return (np.concatenate([i[a] for (i, _, _), a in zip(streams, at)]),
                np.concatenate([c[a] for (_, c, _), a in zip(streams, at)]))

    def stream_counts(self) -> list[int]:
        """Batches of each stream per epoch, the same on every rank and in every epoch: with
        ``batch_size`` the buffer's full batches and one short one (none with ``drop_last``);
        with a budget the most any (rank, stream) emits in epoch 0, plus 2 % and 1 (other
        epochs hold other shards), at most the stream's examples (so the streams' counts
        differ by <= 1 and batch ``i`` stays stream ``i % streams``'s)."""
        sizes = self._stream_sizes()
        if self.budget is None:
            return [self._batches_in(n) for n in sizes]
        if self._count is None:
            most = max(len(b) for r in range(self.num_replicas)
                       for _, _, b in self._streams_of(0, r))
            self._count = most + 1 + most // 50     # slack: later epochs may emit a few more
        return [min(self._count, n) for n in sizes]

    def budget_count(self) -> int:
        """Batches per epoch under a budget (every rank, every epoch): see :meth:`stream_counts`."""
        return sum(self.stream_counts())

    def batches(self, epoch: int | None = None) -> list[list[Key]]:
        """This rank's batches of one epoch (default: the current one): each stream's buffer
        batches, fitted to its count, the streams' batches dealt in turn (not shuffled:
        stream ``w``'s batches reach loader worker ``w``). The last epoch's are kept
        (``__len__``, the padding report and the walk ask for the same epoch)."""
        epoch = self.state.epoch if epoch is None else int(epoch)
        if self._batches is not None and self._batches[0] == epoch:
            return self._batches[1]
        per_stream = []
        for (items, caps, at), count in zip(self._streams_of(epoch, self.rank),
                                            self.stream_counts()):
            batches = [[(int(items[k]), int(caps[k]), epoch) for k in b] for b in at]
            if self.budget is None:
                batches = batches[:count]     # drop_last: the drain's short batch
            else:
                batches = self._fit(batches, count, epoch)
            per_stream.append(batches)
        out: list[list[Key]] = []
        for k in range(max(len(b) for b in per_stream)):
            out += [b[k] for b in per_stream if k < len(b)]
        self._batches = (epoch, out)
        return out

    def _fit(self, batches: list[list[Key]], count: int, epoch: int) -> list[list[Key]]:
        """A stream's budget batches made ``count``: the biggest split in halves (within the
        budget), or, when an epoch emits more than the count, the neighbours whose merged
        padded size is smallest merged (over the budget only when no pair fits it). Merged
        neighbours came from the buffer one after the other: the reader holds one batch more."""
        if len(batches) > count:
            batches = _merge(batches, count, self.lengths)
            over = max((len(b) * self.lengths[[k[0] for k in b]].max() for b in batches
                        if len(b) > 1), default=0.0)
            if over > self.budget:
                log.warning("[data] shards epoch %d rank %d: a stream emits more than its %d "
                            "batches per epoch (set by epoch 0) within the budget %g; merged "
                            "the smallest, the biggest batch is %g. Raise the budget or "
                            "data.shuffle_buffer.", epoch, self.rank, count, self.budget, over)
        return _split(batches, count)

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
        for w, (items, _, _) in enumerate(self._streams_of(epoch, self.rank)):
            stream = items.tolist()
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
                "num_shards": len(self.shard_starts), "stream_order": STREAM_ORDER}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        refuse_other_settings(self, state, _STREAM_SETTINGS,
                              "the same shards, data.loader.num_workers (= streams per rank), "
                              "data.shuffle_buffer and data.epoch_samples")
        saved_order = state.get("stream_order", 1)
        if saved_order != STREAM_ORDER and state.get("position", state.get("offset", 0)):
            # Another order rule would resume into other batches than the saved run's next.
            raise UserError(f"{type(self).__name__}: the checkpoint's data position is in the "
                            f"middle of an epoch of shard order version {saved_order} (this "
                            f"mmtf bucketing inside the shuffle buffer is version "
                            f"{STREAM_ORDER}); resume from a checkpoint saved at an epoch's "
                            f"end, or start a fresh run from the weights.")
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
        shuffle_buffer: training samples per stream in the shuffle buffer: a worker holds
            up to this many read members, and training batches are bucketed within them.
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
                "index_cache": self.index_cache, "placeholder": self.placeholder}

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
