"""A monitored metric that no step logs stops the run at the first validation, in one line.

:class:`MonitorCheck` runs after the first real validation, before EarlyStopping (earlier in
the callback list), and raises :class:`MonitorError` naming the key and the metrics that exist.
Why: docs/design/monitored-metric.md"""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint

from mmtf.errors import MonitorError


class MonitorCheck(Callback):
    """Check once, after the first validation, that every monitored key was logged.

    Args:
        keys: keys monitored besides those of ModelCheckpoint/EarlyStopping callbacks
            (``optimized_metric``, which train() returns to sweepers). Empty strings are ignored.
    """

    def __init__(self, keys: Sequence[str | None] = ()) -> None:
        self.keys = [k for k in keys if k]
        self.checked = False

    def monitored(self, trainer: L.Trainer) -> dict[str, str]:
        """``{key: who monitors it}`` for this trainer's callbacks and ``keys``."""
        found = {key: "optimized_metric" for key in self.keys}
        for cb in trainer.callbacks:
            if isinstance(cb, (ModelCheckpoint, EarlyStopping)) and cb.monitor:
                found.setdefault(cb.monitor, type(cb).__name__)
        return found

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.checked or trainer.sanity_checking:
            return
        self.checked = True
        logged = sorted(k for k in trainer.callback_metrics if not k.endswith("_step"))
        missing = {k: who for k, who in self.monitored(trainer).items()
                   if k not in trainer.callback_metrics}
        if missing:
            key, who = next(iter(missing.items()))
            raise MonitorError(
                f"{who} monitors {key!r}, which this run does not log; logged after validation: "
                f"{', '.join(logged) or 'nothing'}. Set optimized_metric=<one of them> "
                f"(and optimized_mode=min|max).")
