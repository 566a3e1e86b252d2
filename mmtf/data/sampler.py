"""Length-bucketing batch sampler: similar lengths batched together, DDP-aware, deterministic.

Each epoch the sampler (1) lists the epoch's examples — one per item, or per (item, caption)
pair under ``caption_policy="all"``, with the caption drawn per item per epoch under
``"random"``; (2) shuffles them by ``(seed, epoch)``; (3) gives each DDP rank a disjoint,
equal-sized shard (the last few examples are repeated from the start when the count does not
divide, as ``DistributedSampler`` does; ``drop_last`` drops them instead); (4) cuts the shard
into pools of ``bucket_size`` batches, sorts each pool by length and cuts it into batches; (5)
shuffles the batch order. Every rank therefore yields the same number of batches, and a
batch's items have similar lengths, which cuts padding (measured by :func:`padding_fraction`).
Evaluation (``shuffle=False``) sorts the whole shard by length.

The sampler yields lists of ``(item, caption, epoch)`` keys; the datasets use the caption index
to pick the training caption and the epoch to seed random crops, so results never depend on the
number of DataLoader workers.

Under Lightning, ``set_epoch`` reaches the sampler through ``batch_sampler.sampler`` (the epoch
holder below). Set ``trainer.use_distributed_sampler=false`` (mmtf's trainer configs do); if
Lightning injects a ``DistributedSampler`` anyway, its rank, world size and epoch are used.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np
import torch.distributed as dist
from torch.utils.data import BatchSampler, DistributedSampler, Sampler

CaptionPolicy = Literal["random", "all", "first"]
Key = tuple[int, int, int]


class EpochHolder(Sampler[int]):
    """The ``sampler`` of a :class:`BucketBatchSampler`: holds the epoch Lightning sets."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at the start of every epoch."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.size))

    def __len__(self) -> int:
        return self.size


class BucketBatchSampler(BatchSampler):
    """Batches of ``(item, caption, epoch)`` keys with similar lengths (see the module doc).

    Args:
        sampler: the epoch holder (default: a new :class:`EpochHolder`); Lightning may replace
            it with a ``DistributedSampler``, whose rank/world/epoch are then used.
        batch_size: examples per batch.
        drop_last: drop incomplete batches (and the uneven tail of the DDP split).
        lengths: length of every item (seconds or samples; only the order matters).
        num_captions: captions per item (needed by the ``random`` and ``all`` policies).
        caption_policy: ``random`` (one caption per item per epoch), ``all`` (every pair) or
            ``first`` (caption 0: evaluation and classification).
        shuffle: shuffle examples and batches each epoch (training).
        bucketing: sort by length inside pools; False gives plain (shuffled) batches.
        bucket_size: batches per sorting pool (bigger: less padding, less randomness).
        seed: base seed; the order is a function of (seed, epoch, rank).
        num_replicas: DDP world size (default: from torch.distributed, else 1).
        rank: DDP rank (default: from torch.distributed, else 0).
    """

    def __init__(self, sampler: Sampler | None = None, batch_size: int = 32,
                 drop_last: bool = False, *, lengths: Sequence[float],
                 num_captions: Sequence[int] | None = None, caption_policy: CaptionPolicy = "first",
                 shuffle: bool = True, bucketing: bool = True, bucket_size: int = 50,
                 seed: int = 0, num_replicas: int | None = None, rank: int | None = None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size ({batch_size!r}) must be a positive int.")
        if caption_policy not in ("random", "all", "first"):
            raise ValueError(f"caption_policy ({caption_policy!r}) must be 'random', 'all' or "
                             f"'first'; set data.caption_policy=random or all.")
        if caption_policy != "first" and num_captions is None:
            raise ValueError(f"caption_policy={caption_policy!r} needs num_captions.")
        if bucket_size < 1:
            raise ValueError(f"bucket_size ({bucket_size}) must be >= 1.")
        super().__init__(sampler if sampler is not None else EpochHolder(len(lengths)),
                         batch_size, drop_last)
        self.lengths = np.asarray(lengths, dtype=np.float64)
        self.num_captions = None if num_captions is None else np.asarray(num_captions, np.int64)
        if self.num_captions is not None and (self.num_captions < 1).any():
            raise ValueError("num_captions: every item needs at least one caption.")
        self.caption_policy = caption_policy
        self.shuffle, self.bucketing, self.bucket_size = shuffle, bucketing, bucket_size
        self.seed = seed
        self.num_replicas, self.rank = num_replicas, rank

    # ------------------------------------------------------------------ epoch and world
    @property
    def epoch(self) -> int:
        """The current epoch (set by Lightning through ``sampler.set_epoch``)."""
        return int(getattr(self.sampler, "epoch", 0))

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch (for use without Lightning)."""
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def world(self) -> tuple[int, int]:
        """``(num_replicas, rank)`` in effect."""
        if isinstance(self.sampler, DistributedSampler):
            return self.sampler.num_replicas, self.sampler.rank
        if self.num_replicas is not None:
            rank = self.rank or 0
            if not 0 <= rank < self.num_replicas:
                raise ValueError(f"rank ({rank}) must be in [0, num_replicas="
                                 f"{self.num_replicas}).")
            return self.num_replicas, rank
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
        return 1, 0

    # ------------------------------------------------------------------ sizes
    def num_examples(self) -> int:
        """Examples per epoch over all ranks."""
        if self.caption_policy == "all":
            return int(self.num_captions.sum())
        return len(self.lengths)

    def _shard_size(self) -> int:
        world, _ = self.world()
        n = self.num_examples()
        return n // world if self.drop_last else math.ceil(n / world)

    def _pool_sizes(self, shard: int) -> list[int]:
        pool = self.batch_size * self.bucket_size if (self.bucketing and self.shuffle) else shard
        pool = max(pool, 1)
        return [pool] * (shard // pool) + ([shard % pool] if shard % pool else [])

    def _batches_in(self, n: int) -> int:
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __len__(self) -> int:
        return sum(self._batches_in(p) for p in self._pool_sizes(self._shard_size()))

    # ------------------------------------------------------------------ iteration
    def _examples(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(item, caption) arrays of this epoch, before shuffling."""
        n = len(self.lengths)
        if self.caption_policy == "all":
            items = np.repeat(np.arange(n), self.num_captions)
            starts = np.cumsum(self.num_captions) - self.num_captions
            caps = np.arange(len(items)) - np.repeat(starts, self.num_captions)
        elif self.caption_policy == "random":
            rng = np.random.default_rng([self.seed, epoch, 1])
            items = np.arange(n)
            caps = (rng.random(n) * self.num_captions).astype(np.int64)
        else:
            items, caps = np.arange(n), np.zeros(n, dtype=np.int64)
        return items, caps

    def batches(self, epoch: int | None = None) -> list[list[Key]]:
        """This rank's batches of one epoch (what ``__iter__`` yields)."""
        epoch = self.epoch if epoch is None else epoch
        world, rank = self.world()
        items, caps = self._examples(epoch)
        order = np.arange(len(items))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch, 2]).permutation(len(items))
        shard_size = self._shard_size()
        total = shard_size * world
        if total > len(order):  # repeat from the start so every rank gets as many examples
            order = np.concatenate([order, np.resize(order, total - len(order))])
        shard = order[:total][rank::world]
        out: list[list[Key]] = []
        start = 0
        for size in self._pool_sizes(shard_size):
            pool = shard[start:start + size]
            start += size
            if self.bucketing:
                pool = pool[np.argsort(self.lengths[items[pool]], kind="stable")]
            for b in range(0, size, self.batch_size):
                chunk = pool[b:b + self.batch_size]
                if len(chunk) < self.batch_size and self.drop_last:
                    continue
                out.append([(int(items[k]), int(caps[k]), epoch) for k in chunk])
        if self.shuffle:
            perm = np.random.default_rng([self.seed, epoch, 3, rank]).permutation(len(out))
            out = [out[k] for k in perm]
        return out

    def __iter__(self) -> Iterator[list[Key]]:
        yield from self.batches()


def padding_fraction(batches: Sequence[Sequence[Key | int]], lengths: Sequence[float]) -> float:
    """Share of a padded batch tensor that is padding, over all batches.

    Args:
        batches: batches of keys (``(item, caption, epoch)``) or item indices.
        lengths: length of every item.

    Returns:
        ``1 - sum(lengths) / sum(batch_size * longest)``.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    real = padded = 0.0
    for batch in batches:
        ls = lengths[[k[0] if isinstance(k, tuple) else k for k in batch]]
        real += ls.sum()
        padded += len(ls) * ls.max(initial=0.0)
    return 0.0 if padded == 0 else 1.0 - real / padded
