"""Length-bucketing batch sampler: similar lengths batched together, DDP-aware, resumable.

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

Resuming: :class:`BucketBatchSampler` is a
:class:`~mmtf.reliability.EpochShuffleBatchSampler` whose ``epoch_batches(epoch)`` is the
bucketing above, a pure function of ``(seed, epoch, rank)``. It therefore has ``set_epoch``,
``state_dict`` / ``load_state_dict`` (its position inside the epoch) and moves to the next epoch
by itself when iterated again after a complete pass; inside
:func:`~mmtf.reliability.make_stateful_dataloader` Lightning resumes it mid-epoch.

The epoch reaches the sampler through ``set_epoch`` (called by
:class:`~mmtf.reliability.ResumeState` at each epoch start) and, in a run that was not resumed,
through ``batch_sampler.sampler.set_epoch`` (Lightning's own call). After a resume that second
path is ignored: Lightning's epoch counter can run ahead of the epoch the restored position
belongs to. Keep ``trainer.use_distributed_sampler=false`` (mmtf's trainer configs do); if
Lightning injects a ``DistributedSampler`` anyway, its rank and world size are used.

Shapes: none (keys only).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import numpy as np
from torch.utils.data import BatchSampler, DistributedSampler, Sampler

from mmtf.reliability.sampler import EpochShuffleBatchSampler

CaptionPolicy = Literal["random", "all", "first"]
Key = tuple[int, int, int]


class EpochHolder(Sampler[int]):
    """The ``sampler`` of a :class:`BucketBatchSampler`: receives Lightning's ``set_epoch``.

    Args:
        size: number of items (``len()``).
        owner: the batch sampler to pass the epoch on to (unless it was restored from a
            checkpoint, see the module docstring).
    """

    def __init__(self, size: int, owner: Any | None = None) -> None:
        self.size = size
        self.owner = owner
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at the start of every epoch."""
        self.epoch = int(epoch)
        if self.owner is not None and not getattr(self.owner, "was_restored", False):
            self.owner.set_epoch(self.epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.size))

    def __len__(self) -> int:
        return self.size


class BucketBatchSampler(EpochShuffleBatchSampler, BatchSampler):
    """Batches of ``(item, caption, epoch)`` keys with similar lengths (see the module doc).

    Args:
        sampler: the epoch holder (default: a new :class:`EpochHolder`); Lightning may replace
            it with a ``DistributedSampler``, whose rank and world size are then used.
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
        if num_replicas is not None and not 0 <= (rank or 0) < num_replicas:
            raise ValueError(f"rank ({rank}) must be in [0, num_replicas={num_replicas}).")
        if isinstance(sampler, DistributedSampler) and num_replicas is None:
            num_replicas, rank = sampler.num_replicas, sampler.rank   # injected by Lightning
        elif num_replicas is not None and rank is None:
            rank = 0
        self.lengths = np.asarray(lengths, dtype=np.float64)
        self.num_captions = None if num_captions is None else np.asarray(num_captions, np.int64)
        if self.num_captions is not None and (self.num_captions < 1).any():
            raise ValueError("num_captions: every item needs at least one caption.")
        self.caption_policy = caption_policy
        self.bucketing, self.bucket_size = bucketing, bucket_size
        EpochShuffleBatchSampler.__init__(
            self, num_samples=len(self.lengths), batch_size=batch_size, seed=seed,
            shuffle=shuffle, drop_last=drop_last, num_replicas=num_replicas, rank=rank)
        BatchSampler.__init__(self, sampler if sampler is not None
                              else EpochHolder(len(self.lengths), owner=self),
                              batch_size, drop_last)

    # ------------------------------------------------------------------ world
    def world(self) -> tuple[int, int]:
        """``(num_replicas, rank)`` in effect (fixed when the sampler is built)."""
        return self.num_replicas, self.rank

    # ------------------------------------------------------------------ sizes
    def num_examples(self) -> int:
        """Examples per epoch over all ranks."""
        if self.caption_policy == "all":
            return int(self.num_captions.sum())
        return len(self.lengths)

    def _shard_size(self) -> int:
        n = self.num_examples()
        return n // self.num_replicas if self.drop_last else math.ceil(n / self.num_replicas)

    def _pool_sizes(self, shard: int) -> list[int]:
        pool = self.batch_size * self.bucket_size if (self.bucketing and self.shuffle) else shard
        pool = max(pool, 1)
        return [pool] * (shard // pool) + ([shard % pool] if shard % pool else [])

    def _batches_in(self, n: int) -> int:
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __len__(self) -> int:
        return sum(self._batches_in(p) for p in self._pool_sizes(self._shard_size()))

    # ------------------------------------------------------------------ order
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
        """This rank's batches of one epoch (default: the current one), as iteration yields
        them from the epoch's start."""
        epoch = self.epoch if epoch is None else int(epoch)
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

    def epoch_batches(self, epoch: int) -> list[list[Key]]:
        """:meth:`batches` of ``epoch``: what the resumable iteration walks through."""
        return self.batches(epoch)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Position (epoch, batches handed out) plus the settings that fix the order."""
        return {**super().state_dict(), "caption_policy": self.caption_policy,
                "bucketing": self.bucketing, "bucket_size": self.bucket_size,
                "num_examples": self.num_examples()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position.

        Raises:
            ValueError: the position was saved with other data or batching settings.
        """
        mine = self.state_dict()
        differ = [f"{k}={state[k]!r} (now {mine[k]!r})" for k in
                  ("caption_policy", "bucketing", "bucket_size", "num_examples")
                  if k in state and state[k] != mine[k]]
        if differ:
            raise ValueError(
                f"BucketBatchSampler: the checkpoint's data position was saved with "
                f"{', '.join(differ)}; resume with the same data settings (data.caption_policy, "
                f"data.bucketing, data.bucket_size, the same dataset), or start a fresh run "
                f"from the weights.")
        super().load_state_dict(state)


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
