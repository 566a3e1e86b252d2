"""The batch sampler of every mmtf loader: length buckets, caption policy, DDP shards, resumable.

Each epoch: list the examples, shuffle by ``(seed, epoch)``, give each DDP rank an equal share,
sort pools of ``bucket_size`` batches by length, cut them into batches (by ``batch_size`` or a
padded-size ``budget``: docs/design/duration-batching.md) and shuffle the batch order. It yields
``(item, caption, epoch)`` keys; per-item randomness comes from :func:`sample_rng`. The order is
a pure function of ``(seed, epoch, rank)`` (docs/design/exact-resume.md). Keep
``trainer.use_distributed_sampler=false``."""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mmtf.errors import UserError
from mmtf.utils.distributed import gather_objects, is_distributed, world

log = logging.getLogger("mmtf.data")

__all__ = ["BucketBatchSampler", "SamplerState", "padding_fraction", "sample_rng"]

CaptionPolicy = Literal["random", "all", "first"]
Key = tuple[int, int, int]
# The settings that fix the order: a position saved under others means other examples.
_ORDER_SETTINGS = ("seed", "num_samples", "batch_size", "budget", "num_replicas", "shuffle",
                   "drop_last", "caption_policy", "bucketing", "bucket_size", "num_examples")


@dataclass
class SamplerState:
    """Where a :class:`BucketBatchSampler` is in its order.

    Attributes:
        epoch: the epoch whose order is being walked.
        position: batches of ``epoch`` handed out (counted before each is yielded, so a loader
            state read right after a batch says "this batch is consumed").
        restored: the position in this epoch was loaded from a checkpoint.
    """

    epoch: int = 0
    position: int = 0
    restored: bool = False


class BucketBatchSampler:
    """Batches of ``(item, caption, epoch)`` keys with similar lengths (see the module doc).

    Args:
        lengths: length of every item (seconds, samples or pixels; with ``budget`` in its unit).
        batch_size: examples per batch; None with ``budget``.
        budget: instead, examples x the longest length <= ``budget`` (an item over it is a
            batch alone). drop_last: drop incomplete batches and the DDP split's uneven tail.
        num_captions: captions per item (needed by the ``random`` and ``all`` policies).
        caption_policy: ``random`` (one caption per item per epoch), ``all`` (every pair) or
            ``first`` (caption 0: evaluation and classification).
        shuffle: shuffle examples and batches each epoch (training).
        bucketing, bucket_size: sort by length inside pools of this many batches (bigger:
            less padding, less randomness); False gives plain (shuffled) batches.
        num_replicas, rank: DDP world size and rank (default: torch.distributed's, else 1, 0).
    """

    def __init__(self, *, lengths: Sequence[float], batch_size: int | None = 32,
                 budget: float | None = None, drop_last: bool = False,
                 num_captions: Sequence[int] | None = None, caption_policy: CaptionPolicy = "first",
                 shuffle: bool = True, bucketing: bool = True, bucket_size: int = 50,
                 seed: int = 0, num_replicas: int | None = None, rank: int | None = None) -> None:
        name = type(self).__name__
        if budget is not None:
            if batch_size is not None:
                raise UserError(f"{name}: batch_size ({batch_size!r}) and budget ({budget!r}) "
                                f"are both set; one rules: set data.batches.batch_size=null to "
                                f"cut batches by data.batches.max_seconds_per_batch / "
                                f"max_pixels_per_batch.")
            if isinstance(budget, bool) or not isinstance(budget, int | float) or \
                    not 0 < budget < math.inf:
                raise UserError(f"{name}: budget ({budget!r}) must be a positive number; set "
                                f"data.batches.max_seconds_per_batch / max_pixels_per_batch.")
        elif isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"{name}: batch_size ({batch_size!r}) must be a positive int; set "
                            f"data.batches.batch_size.")
        if caption_policy not in ("random", "all", "first"):
            raise UserError(f"{name}: caption_policy ({caption_policy!r}) must be 'random', "
                            f"'all' or 'first'; set data.caption_policy=random or all.")
        if caption_policy != "first" and num_captions is None:
            raise UserError(f"{name}: caption_policy={caption_policy!r} needs num_captions.")
        if bucket_size < 1:
            raise UserError(f"{name}: bucket_size ({bucket_size}) must be >= 1; set "
                            f"data.batches.bucket_size.")
        if len(lengths) < 1:
            raise UserError(f"{name}: lengths is empty; the dataset has no items.")
        if seed < 0:
            raise UserError(f"{name}: seed ({seed}) must be >= 0; set data.seed.")
        from_world = num_replicas is None
        if from_world:
            num_replicas, rank = world() if rank is None else (world()[0], rank)
        rank = 0 if rank is None else rank
        if not 0 <= rank < num_replicas:
            raise UserError(f"{name}: rank ({rank}) must be in [0, num_replicas={num_replicas}).")
        self.lengths = np.asarray(lengths, dtype=np.float64)
        self.num_captions = None if num_captions is None else np.asarray(num_captions, np.int64)
        if self.num_captions is not None and (self.num_captions < 1).any():
            raise UserError(f"{name}: num_captions: every item needs at least one caption.")
        if (self.lengths < 0).any() or not np.isfinite(self.lengths).all():
            raise UserError(f"{name}: lengths must be finite and >= 0.")
        self.batch_size, self.drop_last, self.seed = batch_size, drop_last, seed
        self.budget = None if budget is None else float(budget)
        self._count: int | None = None      # batches per epoch with a budget (computed once)
        self.caption_policy, self.shuffle = caption_policy, shuffle
        self.bucketing, self.bucket_size = bucketing, bucket_size
        self.num_replicas, self.rank = num_replicas, rank
        self.state = SamplerState()
        if from_world and num_replicas > 1 and is_distributed():
            self._refuse_other_items_on_other_ranks()

    def _refuse_other_items_on_other_ranks(self) -> None:
        """Each rank cuts its share out of the item list it read itself: ranks with other
        lists (a shard or file skipped on one node only) would get other batch counts, and DDP
        waits forever in the all-reduce of the rank with more batches. Collective (every rank
        builds its samplers in the same order)."""
        caps = b"" if self.num_captions is None else self.num_captions.tobytes()
        lists = gather_objects((len(self.lengths),
                                hashlib.sha1(self.lengths.tobytes() + caps).hexdigest()))
        if all(other == lists[0] for other in lists):
            return
        said = [f"rank {r} has {n} items" + (" with other lengths or caption counts"
                                              if n == lists[0][0] and h != lists[0][1] else "")
                for r, (n, h) in enumerate(lists)]
        raise UserError(f"{type(self).__name__}: the ranks read different item lists "
                        f"({'; '.join(said)}), so they would cut different numbers of batches "
                        f"and DDP would hang at the epoch's end. Give every rank the same data "
                        f"(a shard or file missing or unreadable on one node is skipped there "
                        f"under data.on_error=skip: run python -m mmtf.data.check on each node, "
                        f"or set data.on_error=raise to see the item).")

    def world(self) -> tuple[int, int]:
        """``(num_replicas, rank)`` in effect (fixed when the sampler is built)."""
        return self.num_replicas, self.rank

    @property
    def epoch(self) -> int:
        """The epoch whose order is being walked (``state.epoch``)."""
        return self.state.epoch

    # ------------------------------------------------------------------ sizes
    def num_examples(self) -> int:
        """Examples per epoch over all ranks."""
        if self.caption_policy == "all":
            return int(self.num_captions.sum())
        return len(self.lengths)

    def _rank_size(self) -> int:
        """Examples this rank walks per epoch (equal on every rank: DDP needs equal batches)."""
        n = self.num_examples()
        return n // self.num_replicas if self.drop_last else math.ceil(n / self.num_replicas)

    def _per_batch(self) -> int:
        """Examples per batch: ``batch_size``, or with a budget how many of the mean length fit
        (it sizes the sorting pools only; the cut follows the real lengths)."""
        if self.budget is None:
            return self.batch_size
        mean = float(self.lengths.mean())
        return max(1, int(self.budget // mean)) if mean > 0 else len(self.lengths)

    def _pool_sizes(self, shard: int, scale: int = 1, sort: bool | None = None) -> list[int]:
        sort = self.bucketing if sort is None else sort
        pool = (self._per_batch() * self.bucket_size * scale
                if (sort and self.shuffle) else shard)
        pool = max(pool, 1)
        return [pool] * (shard // pool) + ([shard % pool] if shard % pool else [])

    def _batches_in(self, n: int) -> int:
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __len__(self) -> int:
        if self.budget is not None:
            return self.budget_count()
        return sum(self._batches_in(p) for p in self._pool_sizes(self._rank_size()))

    def budget_count(self) -> int:
        """Batches per epoch under a budget, on every rank and in every epoch: the most any
        rank cuts in epoch 0 (each rank computes every rank's cut: the order is a pure
        function of seed, epoch and rank)."""
        if self._count is None:
            self._count = max(len(self._cut(*self.rank_examples(0, rank=r), 0))
                              for r in range(self.num_replicas))
        return self._count

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

    def rank_examples(self, epoch: int, rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(item, caption) arrays of the examples of ``epoch`` of ``rank`` (default: this
        sampler's), in walking order, ``_rank_size()`` long. Subclasses that order examples
        otherwise (shard streams, mixtures) override this and ``_rank_size``; bucketing and
        batching stay shared. Any rank's examples must be computable on every rank: batching by
        a budget counts every rank's batches to give them all the same number."""
        rank = self.rank if rank is None else rank
        items, caps = self._examples(epoch)
        order = np.arange(len(items))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch, 2]).permutation(len(items))
        rank_size = self._rank_size()
        total = rank_size * self.num_replicas
        if total > len(order):  # repeat from the start so every rank gets as many examples
            order = np.concatenate([order, np.resize(order, total - len(order))])
        mine = order[:total][rank::self.num_replicas]
        return items[mine], caps[mine]

    def _cut(self, items: np.ndarray, caps: np.ndarray, epoch: int, scale: int = 1,
             sort: bool | None = None) -> list[list[Key]]:
        """A rank's examples -> batches: length-sorted pools (``scale`` times the usual size;
        ``sort`` default: ``bucketing``), cut by ``batch_size`` or by the budget."""
        sort = self.bucketing if sort is None else sort
        out: list[list[Key]] = []
        start = 0
        for size in self._pool_sizes(len(items), scale, sort):
            pool = np.arange(start, start + size)
            start += size
            if sort:
                pool = pool[np.argsort(self.lengths[items[pool]], kind="stable")]
            if self.budget is not None:
                bounds = _pack(self.lengths[items[pool]], self.budget)
            else:
                bounds = [(b, min(b + self.batch_size, size))
                          for b in range(0, size, self.batch_size)]
            for lo, hi in bounds:
                chunk = pool[lo:hi]
                if self.budget is None and len(chunk) < self.batch_size and self.drop_last:
                    continue
                out.append([(int(items[k]), int(caps[k]), epoch) for k in chunk])
        return out

    def _fit_count(self, batches: list[list[Key]], items: np.ndarray, caps: np.ndarray,
                   epoch: int) -> list[list[Key]]:
        """Budget batching: make this epoch's cut exactly :meth:`budget_count` batches long."""
        count = self.budget_count()
        # Fewer batches: bigger sorting pools (then sorted ones, without bucketing), up to the
        # whole rank sorted, the fewest the budget allows.
        for sort in dict.fromkeys((self.bucketing, True)):
            scale = 1
            if sort != self.bucketing:
                batches = self._cut(items, caps, epoch, scale, sort)
            while len(batches) > count and \
                    self._pool_sizes(len(items), scale, sort)[:1] < [len(items)]:
                scale *= 2
                batches = self._cut(items, caps, epoch, scale, sort)
            if len(batches) <= count:
                break
        if len(batches) > count:           # only when epochs differ in their lengths (mixtures)
            batches = _merge(batches, count, self.lengths)
            over = max((len(b) * self.lengths[[k[0] for k in b]].max() for b in batches
                        if len(b) > 1), default=0.0)
            log.warning("[data] epoch %d rank %d: its examples need more than the %d batches "
                        "per epoch set by epoch 0 within the budget %g; merged the smallest, "
                        "the biggest batch is %g. Raise the budget or give epochs the same "
                        "lengths.", epoch, self.rank, count, self.budget, over)
        return _split(batches, count)

    def _order_batches(self, batches: list[list[Key]], epoch: int) -> list[list[Key]]:
        """The order batches are handed out in (training: shuffled by (seed, epoch, rank))."""
        if not self.shuffle:
            return batches
        perm = np.random.default_rng([self.seed, epoch, 3, self.rank]).permutation(len(batches))
        return [batches[k] for k in perm]

    def batches(self, epoch: int | None = None) -> list[list[Key]]:
        """This rank's batches of one epoch (default: the current one), from its start."""
        epoch = self.state.epoch if epoch is None else int(epoch)
        items, caps = self.rank_examples(epoch)
        batches = self._cut(items, caps, epoch)
        if self.budget is not None:
            batches = self._fit_count(batches, items, caps, epoch)
        return self._order_batches(batches, epoch)

    # ------------------------------------------------------------------ walking the order
    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch``: a new epoch starts at its first batch; the current one
        keeps its position (a position loaded from a checkpoint survives the ``set_epoch`` that
        follows a resume)."""
        state = self.state
        if int(epoch) != state.epoch:
            state.epoch, state.position, state.restored = int(epoch), 0, False

    def __iter__(self) -> Iterator[list[Key]]:
        state = self.state
        if state.position >= len(self):           # the last pass was complete: next epoch
            state.epoch, state.position, state.restored = state.epoch + 1, 0, False
        batches = self.batches(state.epoch)
        while state.position < len(batches):
            batch = batches[state.position]
            state.position += 1                   # counted before it is handed out
            yield batch

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Epoch and position plus the settings that fix the order (plain data)."""
        return {"epoch": self.state.epoch, "position": self.state.position, "seed": self.seed,
                "num_samples": len(self.lengths), "batch_size": self.batch_size,
                "budget": self.budget,
                "num_replicas": self.num_replicas, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "caption_policy": self.caption_policy,
                "bucketing": self.bucketing, "bucket_size": self.bucket_size,
                "num_examples": self.num_examples()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position.

        Raises:
            UserError: the position was saved with other data, batching or device settings.
        """
        refuse_other_settings(
            self, state, _ORDER_SETTINGS,
            "the same data settings (data.batches: batch_size, max_seconds_per_batch / "
            "max_pixels_per_batch, bucketing, bucket_size; data.caption_policy, the "
            "same dataset) and number of devices")
        position = state["position"] if "position" in state else state["offset"]   # older checkpoints
        self.state.epoch, self.state.position = int(state["epoch"]), int(position)
        self.state.restored = True


def refuse_other_settings(sampler: Any, state: Mapping[str, Any], keys: Sequence[str],
                          same: str) -> None:
    """Raise when a saved sampler state was made under other order settings than ``sampler``'s.

    Raises:
        UserError: naming each differing key (saved and now) and what to resume with (``same``).
    """
    mine = sampler.state_dict()
    differ = [f"{k}={state[k]!r} (now {mine[k]!r})" for k in keys
              if k in state and state[k] != mine[k]]
    if differ:
        raise UserError(f"{type(sampler).__name__}: the checkpoint's data position was saved "
                        f"with {', '.join(differ)}; resume with {same}, or start a fresh run "
                        f"from the weights.")


def _pack(lengths: np.ndarray, budget: float) -> list[tuple[int, int]]:
    """Greedy cut of a sequence into runs whose count x longest stays within ``budget``
    (a single item over it is a run alone); returns ``[(start, stop), ...]``."""
    bounds, start, longest = [], 0, 0.0
    for i, length in enumerate(lengths.tolist()):
        longest = max(longest, length)
        if i > start and (i - start + 1) * longest > budget:
            bounds.append((start, i))
            start, longest = i, length
    if len(lengths):
        bounds.append((start, len(lengths)))
    return bounds


def _split(batches: list[list[Key]], count: int) -> list[list[Key]]:
    """Split the biggest batches in two (halves side by side) until there are ``count``.
    A part of a batch never has a bigger padded size, so a budget still holds."""
    heap = [(-len(b), (i,), b) for i, b in enumerate(batches)]
    heapq.heapify(heap)
    while len(heap) < count:
        size, key, batch = heapq.heappop(heap)
        if -size < 2:
            raise AssertionError(f"cannot make {count} batches of {len(heap) + 1} examples")
        half = len(batch) // 2
        heapq.heappush(heap, (-half, (*key, 0), batch[:half]))
        heapq.heappush(heap, (half - len(batch), (*key, 1), batch[half:]))
    return [b for _, _, b in sorted(heap, key=lambda e: e[1])]


def _merge(batches: list[list[Key]], count: int, lengths: np.ndarray) -> list[list[Key]]:
    """Merge the neighbouring pair with the smallest merged padded size until ``count`` are
    left (over the budget: the last resort of :meth:`BucketBatchSampler._fit_count`)."""
    batches = [list(b) for b in batches]
    sizes = np.array([len(b) for b in batches], dtype=np.float64)
    longest = np.array([lengths[[k[0] for k in b]].max() for b in batches])
    while len(batches) > count:
        i = int(np.argmin((sizes[:-1] + sizes[1:]) * np.maximum(longest[:-1], longest[1:])))
        batches[i:i + 2] = [batches[i] + batches[i + 1]]
        sizes = np.concatenate([sizes[:i], [sizes[i] + sizes[i + 1]], sizes[i + 2:]])
        longest = np.concatenate([longest[:i], [max(longest[i], longest[i + 1])],
                                  longest[i + 2:]])
    return batches


def sample_rng(seed: int, epoch: int, index: int, stream: int = 0) -> np.random.Generator:
    """A numpy generator that depends only on ``(seed, epoch, index, stream)``: per-item
    randomness (where to crop) then depends neither on the worker nor on a resume.

    Args:
        epoch: the epoch of the key ``(item, caption, epoch)`` the sampler yielded.
        stream: one independent stream per use (0: the crop; :mod:`mmtf.data.augment` has its
            own), so switching one use on does not move another's draws.
    """
    if min(seed, epoch, index, stream) < 0:
        raise ValueError(f"sample_rng: seed ({seed}), epoch ({epoch}), index ({index}) and "
                         f"stream ({stream}) must be >= 0.")
    # Stream 0 keeps the three-number key: the crops of every run before streams existed.
    return np.random.default_rng([seed, epoch, index] + ([stream] if stream else []))


def padding_fraction(batches: Sequence[Sequence[Key | int]], lengths: Sequence[float]) -> float:
    """Share of a padded batch tensor that is padding over all ``batches`` (of keys
    ``(item, caption, epoch)`` or item indices): ``1 - sum(lengths) / sum(batch_size * longest)``.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    real = padded = 0.0
    for batch in batches:
        ls = lengths[[k[0] if isinstance(k, tuple) else k for k in batch]]
        real += ls.sum()
        padded += len(ls) * ls.max(initial=0.0)
    return 0.0 if padded == 0 else 1.0 - real / padded
