"""``last.ckpt`` = the latest training state: every N steps, after every validation run and at
the end of fit.

``ModelCheckpoint(save_last=True)`` with a monitor writes ``last.ckpt`` only on improvement;
:class:`LastCheckpoint` is a last-only ``ModelCheckpoint`` that also writes it after every
validation during fit (unless another callback just did) and when fit ends.
Why: docs/design/last-checkpoint.md."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from mmtf.errors import UserError
from mmtf.utils.compat import (
    checkpoint_every_n_train_steps,
    checkpoint_monitor_candidates,
    checkpoint_save_last,
    checkpoint_saved_at_step,
)

__all__ = ["LastCheckpoint"]


class LastCheckpoint(ModelCheckpoint):
    """Keep ``<dirpath>/last.ckpt`` current: every ``every_n_train_steps``, after validation and
    at the end of fit.

    Args:
        dirpath: checkpoint folder (``${paths.output_dir}/checkpoints``, where
            ``ckpt_path=last`` looks); None = Lightning's default.
        every_n_train_steps: also save every this many optimizer steps (None or 0: only after
            validation runs).
        **kwargs: other ``ModelCheckpoint`` arguments; those that make it last-only are fixed.
    """

    _FIXED = ("monitor", "save_top_k", "save_last", "every_n_epochs", "train_time_interval",
              "save_on_train_epoch_end")

    def __init__(self, *, dirpath: str | None = None, every_n_train_steps: int | None = None,
                 **kwargs: Any) -> None:
        fixed = sorted(set(kwargs) & set(self._FIXED))
        if fixed:
            raise UserError(f"LastCheckpoint: {', '.join(fixed)} cannot be set; it only keeps "
                            f"last.ckpt current. Use model_checkpoint for monitored top-k "
                            f"checkpoints.")
        if every_n_train_steps is not None and every_n_train_steps < 0:
            raise UserError(f"LastCheckpoint: every_n_train_steps ({every_n_train_steps}) must "
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
        candidates = checkpoint_monitor_candidates(self, trainer)
        target = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST)
        for other in trainer.checkpoint_callbacks:
            if other is self or not isinstance(other, ModelCheckpoint):
                continue
            # Ran before us in this validation end and wrote the same file at this step:
            # last.ckpt already holds the post-validation state.
            if (other.last_model_path == target
                    and checkpoint_saved_at_step(other) == trainer.global_step
                    and checkpoint_every_n_train_steps(other) == 0):
                return
        checkpoint_save_last(self, trainer, candidates)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The fit's final state, always (the last steps may follow the last trigger, and the
        # loops have moved on after it), so a killed-and-resumed run leaves the same last.ckpt.
        # Every rank calls this (collective save); exceptions and SIGTERM do not come here.
        if trainer.fast_dev_run or trainer.state.fn != TrainerFn.FITTING or trainer.global_step == 0:
            return
        checkpoint_save_last(self, trainer, checkpoint_monitor_candidates(self, trainer))
