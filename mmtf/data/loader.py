"""DataLoaders that report what they skipped and how much padding they produced, every epoch.

Items skipped under ``data.on_error=skip`` are recorded by the dataset *inside the worker*; the
record rides back in the batch (``_skipped``), and the loader, in the main process, removes it
before the batch reaches the model, adds it to the data module's counter
(``datamodule.error_counts``) and logs a per-epoch summary when the pass ends::

    [data] train epoch 3: 94 batches, 3000 examples, padding 4.1% of audio samples;
    skipped 2 (non_finite=2 (e.g. a.wav (clotho_captions_development.csv line 8)))

The same numbers are kept in ``loader.last_epoch`` (``padding_fraction``, ``skipped``, ...).

:class:`DataLoader` (val/test) is a ``torch.utils.data.DataLoader``; :class:`StatefulDataLoader`
(train) is torchdata's, which Lightning checkpoints and resumes mid-epoch (build it with
:func:`mmtf.reliability.make_stateful_dataloader`). The report wraps the iterator and draws no
random numbers, so it changes neither the batches nor the loader's saved state.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch.utils.data
import torchdata.stateful_dataloader

from mmtf.data.errors import ErrorCounter

log = logging.getLogger("mmtf.data")

# torchdata 0.11 calls the deprecated torch.set_vital on every iterator: a UserWarning per epoch
# that tells the user nothing they can act on.
warnings.filterwarnings("ignore", message=r"'set_vital' is deprecated", category=UserWarning,
                        module=r"torchdata\.stateful_dataloader")

__all__ = ["DataLoader", "StatefulDataLoader"]


def _watch(loader: Any, it: Iterator[Any]) -> Iterator[Any]:
    """Yield ``it``'s batches without their ``_skipped`` records; report when the pass ends."""
    sampler = loader.batch_sampler
    errors = ErrorCounter()
    batches = examples = 0
    real = padded = 0
    finished = False
    try:
        for batch in it:
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
        # The epoch of this pass: a resumable sampler records it when the pass begins (it may
        # move to the next epoch by itself), others only have their current epoch.
        epoch = getattr(sampler, "pass_epoch", None)
        epoch = int(getattr(sampler, "epoch", 0) if epoch is None else epoch)
        loader.counter.merge(errors)
        stats = {"epoch": epoch, "batches": batches, "examples": examples,
                 "padding_fraction": (1 - real / padded) if padded else 0.0,
                 "skipped": errors.as_dict(), "complete": finished}
        loader.last_epoch = stats
        msg = (f"[data] {loader.split} epoch {epoch}: {batches} batches, {examples} examples"
               + (f", padding {100 * stats['padding_fraction']:.1f}% of audio samples"
                  if padded else ""))
        if errors:
            log.warning("%s; skipped %s", msg, errors.summary())
        elif batches:
            log.info("%s; nothing skipped", msg)
        # Without Lightning nobody calls set_epoch: advance it so the next pass reshuffles.
        if finished and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch + 1)


class _Reporting:
    """What both loaders add: the error counter, the split name and the per-pass report."""

    def __init__(self, dataset: Any, *, counter: ErrorCounter | None = None, split: str = "",
                 **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)  # type: ignore[call-arg]
        self.counter = counter if counter is not None else ErrorCounter()
        self.split = split
        self.last_epoch: dict[str, Any] = {}

    def __iter__(self) -> Iterator[Any]:
        return _watch(self, super().__iter__())  # type: ignore[misc]


class DataLoader(_Reporting, torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` plus per-epoch skip counts and padding stats.

    Args:
        dataset: the dataset.
        counter: where skipped items are added (the data module's ``error_counts``).
        split: ``train`` | ``val`` | ``test``, for the log line.
        **kwargs: passed to ``torch.utils.data.DataLoader``.
    """


class StatefulDataLoader(_Reporting, torchdata.stateful_dataloader.StatefulDataLoader):
    """torchdata's ``StatefulDataLoader`` (mid-epoch ``state_dict``) with the same reports.

    ``state_dict()`` is the wrapped iterator's: it counts exactly the batches this loader
    handed out, since the report does not read ahead.

    Args:
        dataset: the dataset.
        counter: where skipped items are added (the data module's ``error_counts``).
        split: for the log line.
        **kwargs: passed to ``StatefulDataLoader``.
    """
