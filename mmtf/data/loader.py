"""A DataLoader that reports what it skipped and how much padding it produced, every epoch.

Items skipped under ``data.on_error=skip`` are recorded by the dataset *inside the worker*; the
record rides back in the batch (``_skipped``), and this loader, in the main process, removes it
before the batch reaches the model, adds it to the data module's counter
(``datamodule.error_counts``) and logs a per-epoch summary when the pass ends::

    [data] train epoch 3: 94 batches, 3000 examples, padding 4.1% of audio samples;
    skipped 2 (non_finite=2 (e.g. a.wav (clotho_captions_development.csv line 8)))

The same numbers are kept in ``loader.last_epoch`` (``padding_fraction``, ``skipped``, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from mmtf.data.errors import ErrorCounter

log = logging.getLogger("mmtf.data")


class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` plus per-epoch skip counts and padding stats.

    Args:
        dataset: the dataset.
        counter: where skipped items are added (the data module's ``error_counts``).
        split: ``train`` | ``val`` | ``test``, for the log line.
        **kwargs: passed to ``torch.utils.data.DataLoader``.
    """

    def __init__(self, dataset: Any, *, counter: ErrorCounter | None = None, split: str = "",
                 **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.counter = counter if counter is not None else ErrorCounter()
        self.split = split
        self.last_epoch: dict[str, Any] = {}

    def __iter__(self) -> Iterator[Any]:
        return self._watch(super().__iter__())

    def _watch(self, it: Iterator[Any]) -> Iterator[Any]:
        sampler = self.batch_sampler
        epoch = int(getattr(sampler, "epoch", 0))
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
            self.counter.merge(errors)
            stats = {"epoch": epoch, "batches": batches, "examples": examples,
                     "padding_fraction": (1 - real / padded) if padded else 0.0,
                     "skipped": errors.as_dict(), "complete": finished}
            self.last_epoch = stats
            msg = (f"[data] {self.split} epoch {epoch}: {batches} batches, {examples} examples"
                   + (f", padding {100 * stats['padding_fraction']:.1f}% of audio samples"
                      if padded else ""))
            if errors:
                log.warning("%s; skipped %s", msg, errors.summary())
            elif batches:
                log.info("%s; nothing skipped", msg)
            # Without Lightning nobody calls set_epoch: advance it so the next pass reshuffles.
            if finished and hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch + 1)
