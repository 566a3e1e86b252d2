"""``last.ckpt`` = the latest training state: after every validation run and every N steps.

Why not ``ModelCheckpoint(save_last=True)`` alone? In Lightning 2.6 ``save_last`` means "copy
whichever checkpoint this callback just saved": a callback that monitors a metric writes
``last.ckpt`` only in the validations where that metric improved (``on_validation_end`` saves
last only ``if self._last_global_step_saved == trainer.global_step``). After a run of epochs
without improvement, ``ckpt_path=last`` would resume from the last *improvement*, silently
throwing the later epochs away. A second ``ModelCheckpoint(monitor=None, save_top_k=0,
save_last=True)`` does not help at validation end either (nothing top-k is saved, so nothing
last is), and ``every_n_train_steps`` / ``every_n_epochs`` cannot be combined in one callback.

:class:`LastCheckpoint` is that second ``ModelCheckpoint`` (same files, same checkpoint IO, its
state in checkpoints) with one change: at the end of every validation run during fit it writes
``last.ckpt``, unless another checkpoint callback already wrote that file after this
validation (the monitoring callback, when the metric improved). Step-triggered saves
(``every_n_train_steps``) are Lightning's own. The checkpoint written after validation is the
one to resume from at an epoch boundary: validation is done and the loops say so.

Shapes: none.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

__all__ = ["LastCheckpoint"]


class LastCheckpoint(ModelCheckpoint):
    """Keep ``<dirpath>/last.ckpt`` current: every ``every_n_train_steps`` and after validation.

    Args:
        dirpath: checkpoint folder (``${paths.output_dir}/checkpoints``, where
            ``ckpt_path=last`` looks); None = Lightning's default.
        every_n_train_steps: also save every this many optimizer steps (None or 0: only after
            validation runs).
        **kwargs: other ``ModelCheckpoint`` arguments (``filename``, ``verbose`` ...); the ones
            that make it a last-only checkpoint (``monitor``, ``save_top_k``, ``save_last``,
            ``every_n_epochs``, ``save_on_train_epoch_end``) are fixed.
    """

    _FIXED = ("monitor", "save_top_k", "save_last", "every_n_epochs", "train_time_interval",
              "save_on_train_epoch_end")

    def __init__(self, *, dirpath: str | None = None, every_n_train_steps: int | None = None,
                 **kwargs: Any) -> None:
        fixed = sorted(set(kwargs) & set(self._FIXED))
        if fixed:
            raise ValueError(f"LastCheckpoint: {', '.join(fixed)} cannot be set; it only keeps "
                             f"last.ckpt current. Use model_checkpoint for monitored top-k "
                             f"checkpoints.")
        if every_n_train_steps is not None and every_n_train_steps < 0:
            raise ValueError(f"LastCheckpoint: every_n_train_steps ({every_n_train_steps}) must "
                             f"be >= 0 or null.")
        kwargs.setdefault("enable_version_counter", False)   # share last.ckpt, never last-v1
        super().__init__(dirpath=dirpath, monitor=None, save_top_k=0, save_last=True,
                         every_n_train_steps=every_n_train_steps or None,
                         every_n_epochs=None if every_n_train_steps else 0,
                         save_on_train_epoch_end=False, **kwargs)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (trainer.fast_dev_run or trainer.sanity_checking
                or trainer.state.fn != TrainerFn.FITTING or trainer.global_step == 0):
            return
        candidates = self._monitor_candidates(trainer)
        target = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST)
        for other in trainer.checkpoint_callbacks:
            if other is self or not isinstance(other, ModelCheckpoint):
                continue
            # Ran before us in this validation end and wrote the same file at this step:
            # last.ckpt already holds the post-validation state.
            if (other.last_model_path == target and other._last_global_step_saved
                    == trainer.global_step and other._every_n_train_steps == 0):
                return
        self._save_last_checkpoint(trainer, candidates)
