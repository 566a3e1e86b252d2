"""The loaders of every split: skip counts and padding per epoch; the train loader resumes.

Items skipped in a worker ride back in the batch (``_skipped``); the loader removes them, adds
them to ``datamodule.error_counts`` and logs a per-epoch summary (kept in ``loader.last_epoch``).
:func:`make_loader` builds :class:`DataLoader` (val/test) or torchdata's
:class:`StatefulDataLoader` (train, resumed mid-epoch by Lightning) over a
:class:`~mmtf.data.sampler.BucketBatchSampler`; the report draws no random numbers."""

from __future__ import annotations

import functools
import logging
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch.utils.data
import torchdata.stateful_dataloader
from lightning.fabric.utilities.seed import pl_worker_init_function

from mmtf.data.errors import ErrorCounter
from mmtf.data.sampler import BucketBatchSampler
from mmtf.utils.compat import shutdown_loader_workers
from mmtf.utils.distributed import world

log = logging.getLogger("mmtf.data")

__all__ = ["DataLoader", "StatefulDataLoader", "make_loader"]


def _watch(loader: Any, it: Iterator[Any]) -> Iterator[Any]:
    """Yield ``it``'s batches without their ``_skipped`` records; report when the pass ends."""
    sampler = loader.batch_sampler
    epoch = None                   # the epoch of this pass, read once it has begun
    errors = ErrorCounter()
    batches = examples = 0
    real = padded = 0
    finished = False
    try:
        for batch in it:
            if epoch is None:
                epoch = sampler.epoch
            if isinstance(batch, dict):
                errors.update(batch.pop("_skipped", ()))
                if "audio_lengths" in batch:
                    real += int(batch["audio_lengths"].sum())
                    padded += batch["audio"].numel()
                examples += len(batch.get("ids", ()))
            batches += 1
            yield batch
        finished = True
    finally:
        epoch = sampler.epoch if epoch is None else epoch
        loader.counter.merge(errors)
        stats = {"epoch": epoch, "batches": batches, "examples": examples,
                 "padding_fraction": (1 - real / padded) if padded else 0.0,
                 "skipped": errors.as_dict(), "complete": finished}
        loader.last_epoch = stats
        msg = (f"[data] {loader.split} epoch {epoch}: {batches} batches, {examples} examples"
               + (f", padding {100 * stats['padding_fraction']:.1f}% of audio samples"
                  if padded else ""))
        # The decoded-media cache is visible here only when the main process decodes.
        report = getattr(loader.dataset, "cache_report", None)
        if loader.num_workers == 0 and callable(report) and (held := report()):
            msg += f", {held}"
        if errors:
            log.warning("%s; skipped %s", msg, errors.summary())
        elif batches:
            log.info("%s; nothing skipped", msg)
        if finished:               # the next pass is the next epoch, whoever iterates
            sampler.set_epoch(epoch + 1)


class _Reporting:
    """What both loaders add: the error counter, the split name and the per-pass report."""

    def __init__(self, dataset: Any, *, counter: ErrorCounter | None = None, split: str = "",
                 **kwargs: Any) -> None:
        with warnings.catch_warnings():
            # torchdata 0.11's constructor calls the deprecated torch.set_vital: a UserWarning
            # per loader that tells the user nothing they can act on.
            warnings.filterwarnings("ignore", message=r"'set_vital' is deprecated",
                                    category=UserWarning)
            super().__init__(dataset, **kwargs)  # type: ignore[call-arg]
        self.counter = counter if counter is not None else ErrorCounter()
        self.split = split
        self.last_epoch: dict[str, Any] = {}
        self._pass: weakref.ref | None = None      # the current pass's iterator (stop_workers)

    def __iter__(self) -> Iterator[Any]:
        inner = super().__iter__()  # type: ignore[misc]
        self._pass = weakref.ref(inner)
        return _watch(self, inner)

    def stop_workers(self) -> int:
        """Shut down the worker processes of the current pass now; how many it had.

        A pass not run to its end keeps its workers until its iterator is garbage-collected,
        which Lightning's reference cycles delay past the run. The next ``iter()`` starts new
        ones.
        """
        inner = self._pass() if self._pass is not None else None
        return 0 if inner is None else shutdown_loader_workers(self, inner)


class DataLoader(_Reporting, torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` plus per-epoch skip counts and padding stats.

    Args:
        counter: where skipped items are added (the data module's ``error_counts``).
        split: ``train`` | ``val`` | ``test``, for the log line.
    """


class StatefulDataLoader(_Reporting, torchdata.stateful_dataloader.StatefulDataLoader):
    """torchdata's ``StatefulDataLoader`` (mid-epoch ``state_dict``) with the same reports.

    ``state_dict()`` counts exactly the batches handed out (the report does not read ahead).
    ``counter``, ``split``: as :class:`DataLoader`.
    """


def make_loader(dataset: Any, batch_sampler: BucketBatchSampler, *, resumable: bool, seed: int,
                collate_fn: Callable[[list[Any]], Any] | None = None, num_workers: int = 0,
                pin_memory: bool = False, persistent_workers: bool = False,
                counter: ErrorCounter | None = None, split: str = "",
                ) -> DataLoader | StatefulDataLoader:
    """A reporting loader over ``batch_sampler`` that draws nothing from the global generators.

    Its own ``torch.Generator`` supplies the workers' base seed (else each ``iter()`` draws
    from the global generator, shifting dropout after a resume or a validation).

    Args:
        dataset: map-style dataset taking the sampler's ``(item, caption, epoch)`` keys.
        resumable: a :class:`StatefulDataLoader` (train) instead of a :class:`DataLoader`.
        seed: seed of the loader's generator.
        collate_fn, num_workers, pin_memory, persistent_workers: as
            ``torch.utils.data.DataLoader`` (``persistent_workers`` only with workers).
        counter: where skipped items are added (the data module's ``error_counts``).
        split: ``train`` | ``val`` | ``test``, for the log line.
    """
    workers: dict[str, Any] = {}
    if num_workers > 0:
        workers = {"worker_init_fn": functools.partial(pl_worker_init_function, rank=world()[1]),
                   "persistent_workers": persistent_workers}
    cls = StatefulDataLoader if resumable else DataLoader
    return cls(dataset, batch_sampler=batch_sampler, num_workers=num_workers,
               collate_fn=collate_fn, pin_memory=pin_memory, counter=counter, split=split,
               generator=torch.Generator().manual_seed(seed), **workers)
