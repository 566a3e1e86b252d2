"""A resumable, deterministic shuffling batch sampler and a StatefulDataLoader factory.

How Lightning 2.6 resumes a train dataloader mid-epoch (read from the installed source):

* ``FitLoop.on_save_checkpoint`` stores ``[dl.state_dict() for dl in loaders if stateful]`` under
  ``checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]``; "stateful" means the
  loader has ``state_dict``/``load_state_dict`` (torchdata's ``StatefulDataLoader`` does, a plain
  ``DataLoader`` does not, and then Lightning only warns that a mid-epoch resume is unreliable).
* ``FitLoop.setup_data`` calls ``load_state_dict`` on the loader *before* the first ``iter()``,
  and on a resume does not call ``iter()`` again at the epoch start.
* A loader with a length is not prefetched (``_PrefetchDataFetcher`` skips prefetching when
  ``len()`` is known), so a checkpoint taken in ``on_train_batch_end`` of batch ``k`` holds a loader
  state of exactly ``k + 1`` batches. ``__len__`` on the batch sampler is therefore required.
* ``StatefulDataLoader`` stores ``batch_sampler.state_dict()`` when the batch sampler has one
  (with workers: the state when the batch's indices were sent to a worker) and, on load, calls
  ``batch_sampler.load_state_dict(...)`` then ``iter(batch_sampler)``, which must continue from
  where the saved state was. Without ``state_dict`` it fast-forwards ``iter(batch_sampler)`` by the
  number of batches already yielded, which is only right if the sampler re-creates the same
  order, i.e. it already knows the epoch, which nothing restores for it.
* Lightning calls ``set_epoch`` only on ``dl.sampler`` and ``dl.batch_sampler.sampler``, never on
  a batch sampler. :class:`~mmtf.reliability.ResumeState` calls ``batch_sampler.set_epoch`` at
  each epoch start; this sampler also moves to the next epoch by itself when iterated again
  after a complete pass.

So a batch sampler that resumes exactly has ``__iter__``, ``__len__``, ``set_epoch(epoch)``,
``state_dict()`` -> plain data and ``load_state_dict(state)``; its order depends only on
``(seed, epoch)``; and it counts a batch as consumed *before* yielding it. The easiest way to
get all of that for another batching (length buckets) is to subclass
:class:`EpochShuffleBatchSampler` and override ``epoch_batches(epoch)`` and ``__len__``.

Shapes: none (indices only).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.utilities.seed import pl_worker_init_function
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

__all__ = ["EpochShuffleBatchSampler", "make_stateful_dataloader"]


def _dist_info(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    initialized = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    return num_replicas, rank


class EpochShuffleBatchSampler:
    """Batches of indices in an order fixed by ``(seed, epoch)``, resumable mid-epoch.

    Under DDP each rank takes every ``num_replicas``-th index of the shared permutation
    (padded by wrapping around, like ``DistributedSampler``), so all ranks have the same number
    of batches; set the Trainer's ``use_distributed_sampler=False``.

    Args:
        num_samples: dataset length.
        batch_size: indices per batch.
        seed: order seed; the permutation of epoch ``e`` is ``randperm(num_samples)`` drawn from
            a generator seeded with ``seed + e``.
        shuffle: permute (True) or keep ``0..num_samples-1`` (False).
        drop_last: drop this rank's last incomplete batch.
        num_replicas, rank: DDP sharding; None = from ``torch.distributed`` (1, 0 when not
            initialised).
        yield_epoch: yield ``(epoch, index)`` pairs instead of indices, for a Dataset that
            draws per-sample randomness with :func:`~mmtf.reliability.sample_rng`.
    """

    def __init__(self, *, num_samples: int, batch_size: int, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False, num_replicas: int | None = None,
                 rank: int | None = None, yield_epoch: bool = False) -> None:
        num_replicas, rank = _dist_info(num_replicas, rank)
        if num_samples < 1:
            raise ValueError(f"EpochShuffleBatchSampler: num_samples ({num_samples}) must be >= 1; "
                             f"the dataset is empty.")
        if batch_size < 1:
            raise ValueError(f"EpochShuffleBatchSampler: batch_size ({batch_size}) must be >= 1.")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"EpochShuffleBatchSampler: rank ({rank}) must be in "
                             f"[0, num_replicas={num_replicas}).")
        if seed < 0:
            raise ValueError(f"EpochShuffleBatchSampler: seed ({seed}) must be >= 0.")
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.shuffle, self.drop_last, self.yield_epoch = shuffle, drop_last, yield_epoch
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self._offset = 0                     # batches of self.epoch already handed out
        self._restored = False               # position came from load_state_dict
        self._hold = False                   # next pass is empty (restored epoch complete)
        self._advanced_from_restore = False  # the active pass left a restored, complete epoch
        self.pass_epoch: int | None = None   # epoch of the last pass that began (diagnostics)
        self.was_restored = False            # load_state_dict was called at least once

    # ------------------------------------------------------------------ order
    @property
    def samples_per_rank(self) -> int:
        return math.ceil(self.num_samples / self.num_replicas)

    def __len__(self) -> int:
        n = self.samples_per_rank
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _indices(self, epoch: int) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.num_samples, generator=g).tolist()
        else:
            order = list(range(self.num_samples))
        total = self.samples_per_rank * self.num_replicas
        order += (order * math.ceil(total / len(order)))[: total - len(order)]   # wrap-pad
        return order[self.rank:total:self.num_replicas]

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``, in order.

        Override it (and ``__len__``) for another batching, e.g. length bucketing: the resume
        logic only needs the result to depend on nothing but the constructor arguments and
        ``epoch``, and to hold ``len(self)`` batches (the same number on every rank).
        """
        indices, size = self._indices(epoch), self.batch_size
        stop = len(self) * size if self.drop_last else len(indices)
        return [indices[i:i + size] for i in range(0, stop, size)]

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch``.

        A new epoch starts at its first batch. The current epoch keeps its position, so a
        position restored by ``load_state_dict`` survives the ``set_epoch`` that follows a
        resume; if that restored epoch was already complete, the next pass yields nothing (the
        trainer is finishing that epoch, not starting the next one).
        """
        epoch = int(epoch)
        if epoch != self.epoch:
            self.epoch, self._offset = epoch, 0
            self._restored = self._hold = self._advanced_from_restore = False
        elif self._restored and self._offset >= len(self):
            self._hold = True

    def __iter__(self) -> Iterator[list[int] | list[tuple[int, int]]]:
        if self._hold:                    # a restored, complete epoch: nothing left in it
            self._hold = self._restored = False
            return
        if self._offset >= len(self):     # the last pass was complete: next epoch
            self._advanced_from_restore = self._restored
            self.epoch, self._offset = self.epoch + 1, 0
        elif self._advanced_from_restore and not self._restored:
            # A pass that left a restored, complete epoch was abandoned and a new one begins
            # (Lightning re-creates the iterator at the epoch start after resuming a checkpoint
            # written at an epoch end). With workers it had prefetched batches it never handed
            # out, so start this epoch over instead of continuing after them.
            self._offset, self._advanced_from_restore = 0, False
        self._restored = False
        self.pass_epoch = self.epoch
        epoch = self.epoch
        batches = self.epoch_batches(epoch)
        while self._offset < len(batches):
            batch = batches[self._offset]
            # Count the batch before handing it out: StatefulDataLoader reads state_dict()
            # right after receiving it, and that state must say "this batch is consumed".
            self._offset += 1
            yield [(epoch, i) for i in batch] if self.yield_epoch else batch

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Position in the order: plain ints, loadable with ``weights_only=True``."""
        return {"epoch": self.epoch, "offset": self._offset, "seed": self.seed,
                "num_samples": self.num_samples, "batch_size": self.batch_size,
                "num_replicas": self.num_replicas, "shuffle": self.shuffle,
                "drop_last": self.drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position.

        Raises:
            ValueError: the saved order was made with other settings (the same position would
                then mean other samples); the message names them and the fix.
        """
        mine = self.state_dict()
        differ = [f"{k}={state[k]!r} (now {mine[k]!r})" for k in
                  ("seed", "num_samples", "batch_size", "num_replicas", "shuffle", "drop_last")
                  if k in state and state[k] != mine[k]]
        if differ:
            raise ValueError(
                f"EpochShuffleBatchSampler: the checkpoint's data position was saved with "
                f"{', '.join(differ)}; resume with the same data settings and number of "
                f"devices, or start a fresh run from the weights.")
        self.epoch, self._offset = int(state["epoch"]), int(state["offset"])
        self._restored, self._hold, self._advanced_from_restore = True, False, False
        self.was_restored = True


def make_stateful_dataloader(dataset: Dataset, batch_sampler: Any, *, num_workers: int = 0,
                             collate_fn: Any | None = None, seed: int = 0,
                             pin_memory: bool = False, persistent_workers: bool = False,
                             prefetch_factor: int | None = None,
                             rank: int | None = None,
                             loader_cls: type[StatefulDataLoader] = StatefulDataLoader,
                             **loader_kwargs: Any) -> StatefulDataLoader:
    """A ``StatefulDataLoader`` over ``batch_sampler`` that Lightning can resume mid-epoch.

    * Its own ``torch.Generator`` (seeded by ``seed``) supplies the workers' base seed, so
      creating an iterator never draws from the global torch generator (which would shift
      dropout after a resume at an epoch boundary).
    * Workers are seeded by Lightning's ``pl_worker_init_function`` (python, numpy and torch
      from base seed, worker id and rank), so runs are repeatable. Worker-side randomness is
      *not* resumable mid-epoch that way; derive it from ``(seed, epoch, index)``.

    Args:
        dataset: map-style dataset.
        batch_sampler: e.g. :class:`EpochShuffleBatchSampler`; needs ``__len__`` and, for an
            exact resume, ``state_dict``/``load_state_dict``/``set_epoch``.
        num_workers, collate_fn, pin_memory, persistent_workers, prefetch_factor: as
            ``torch.utils.data.DataLoader``.
        seed: seed of the loader's generator.
        rank: global rank mixed into worker seeds; None = from ``torch.distributed``.
        loader_cls: ``StatefulDataLoader`` or a subclass (e.g.
            :class:`mmtf.data.loader.StatefulDataLoader`, which adds per-epoch reports).
        **loader_kwargs: further keyword arguments of ``loader_cls``.
    """
    for name in ("__len__", "state_dict", "load_state_dict"):
        if not hasattr(batch_sampler, name):
            raise ValueError(
                f"make_stateful_dataloader: batch_sampler {type(batch_sampler).__name__} has no "
                f"{name}(); a mid-epoch resume needs __len__, state_dict and load_state_dict "
                f"(see mmtf.reliability.EpochShuffleBatchSampler).")
    if num_workers < 0:
        raise ValueError(f"make_stateful_dataloader: num_workers ({num_workers}) must be >= 0.")
    _, rank = _dist_info(None, rank)
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs["worker_init_fn"] = functools.partial(pl_worker_init_function, rank=rank)
        kwargs["persistent_workers"] = persistent_workers
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
    if not issubclass(loader_cls, StatefulDataLoader):
        raise ValueError(f"make_stateful_dataloader: loader_cls ({loader_cls.__name__}) must be "
                         f"a torchdata StatefulDataLoader (sub)class; Lightning only resumes "
                         f"loaders that have state_dict/load_state_dict.")
    return loader_cls(dataset, batch_sampler=batch_sampler, num_workers=num_workers,
                      collate_fn=collate_fn, pin_memory=pin_memory,
                      generator=torch.Generator().manual_seed(seed), **kwargs, **loader_kwargs)
