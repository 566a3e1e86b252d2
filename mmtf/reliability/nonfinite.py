"""Non-finite (NaN/inf) training loss: stop with a message that says where, or skip the step.

:class:`NonFiniteLossGuard` checks the loss in ``on_before_backward`` (:func:`check_finite_loss`),
all-reducing the flag so every DDP rank takes the same branch; ``skip`` lets backward run and
drops every gradient in ``on_before_optimizer_step`` (weights and optimizer state untouched),
counting ``train/nonfinite_skipped``. Why a callback: docs/design/nonfinite-loss.md.

Shapes: ``loss`` is a scalar tensor."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.optim import Optimizer

from mmtf.errors import UserError
from mmtf.utils.distributed import world

log = logging.getLogger(__name__)

__all__ = ["NonFiniteLossError", "NonFiniteLossGuard", "check_finite_loss"]

Policy = Literal["raise", "skip"]
POLICIES = ("raise", "skip")


class NonFiniteLossError(FloatingPointError):
    """The training loss is NaN or inf; names the step, the batch and the fix."""


def _ranks_nonfinite(loss: Tensor) -> tuple[int, int]:
    """(number of ranks whose loss is non-finite, world size), agreed on by all ranks."""
    bad = (~torch.isfinite(loss.detach())).any().to(torch.int32).reshape(1)   # (1,)
    size, _ = world()
    if size > 1:
        dist.all_reduce(bad, op=dist.ReduceOp.SUM)
    return int(bad.item()), size


def check_finite_loss(loss: Tensor, *, step: int, batch_idx: int, policy: Policy = "raise",
                      batch_ids: Sequence[Any] | None = None) -> bool:
    """True when every rank's loss is finite; otherwise raise or return False to skip.

    Call it on every rank at every training step (it is a collective under DDP).

    Args:
        step, batch_idx: the global step and the batch index in the epoch, for the message.
        policy: ``raise`` (stop with :class:`NonFiniteLossError`) or ``skip`` (return False).
        batch_ids: sample ids of the batch (``batch["ids"]``), named in the error.

    Raises:
        NonFiniteLossError: with ``policy="raise"`` when any rank's loss is non-finite.
        UserError: unknown ``policy``.
    """
    if policy not in POLICIES:
        raise UserError(f"check_finite_loss: policy ({policy!r}) must be one of {POLICIES}.")
    n_bad, world = _ranks_nonfinite(loss)
    if n_bad == 0:
        return True
    if policy == "skip":
        return False
    local = loss.detach().float()
    where = f"global step {step}, batch {batch_idx}"
    if world > 1:
        where += f" (non-finite on {n_bad} of {world} ranks; this rank: {local.item()})"
    else:
        where += f" (loss = {local.item()})"
    ids = ""
    if batch_ids is not None and not bool(torch.isfinite(local)):
        shown = [str(i) for i in list(batch_ids)[:16]]
        more = f" ... (+{len(batch_ids) - 16})" if len(batch_ids) > 16 else ""
        ids = f"; batch ids: {', '.join(shown)}{more}"
    raise NonFiniteLossError(
        f"non-finite training loss at {where}{ids}. Lower the learning rate or raise warmup, "
        f"keep gradient clipping on (trainer.gradient_clip_val), check these inputs, try "
        f"precision=32-true or bf16-mixed instead of 16-mixed; or skip such steps with "
        f"callbacks.nonfinite_loss.policy=skip.")


class NonFiniteLossGuard(Callback):
    """Check every training loss; raise, or skip the optimizer step, when it is NaN/inf.

    Args:
        policy: ``raise`` (stop with :class:`NonFiniteLossError`) | ``skip``.
        max_skips: with ``skip``, raise anyway at the next non-finite loss once this many steps
            were skipped in the run (a loss that stays NaN is not a glitch); None = never.
        ids_key: key of the sample ids in a dict batch, named in the error message.
    """

    def __init__(self, *, policy: Policy = "raise", max_skips: int | None = 100,
                 ids_key: str = "ids") -> None:
        if policy not in POLICIES:
            raise UserError(f"NonFiniteLossGuard: policy ({policy!r}) must be one of "
                            f"{POLICIES}; set callbacks.nonfinite_loss.policy=raise or skip.")
        if max_skips is not None and max_skips < 0:
            raise UserError(f"NonFiniteLossGuard: max_skips ({max_skips}) must be >= 0 or "
                            f"null; set callbacks.nonfinite_loss.max_skips.")
        self.policy, self.max_skips, self.ids_key = policy, max_skips, ids_key
        self.skipped = 0
        self._skip_pending = False
        self._batch_idx = -1
        self._batch_ids: Sequence[Any] | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._batch_idx = batch_idx
        ids = batch.get(self.ids_key) if isinstance(batch, dict) else None
        self._batch_ids = list(ids) if isinstance(ids, (list, tuple)) else None

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           loss: Tensor) -> None:
        policy: Policy = self.policy
        if policy == "skip" and self.max_skips is not None and self.skipped >= self.max_skips:
            policy = "raise"           # the next non-finite loss is one too many
        if not check_finite_loss(loss, step=trainer.global_step, batch_idx=self._batch_idx,
                                 policy=policy, batch_ids=self._batch_ids):
            self._skip_pending = True  # with accumulation: any bad micro-batch spoils the step

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                 optimizer: Optimizer) -> None:
        if not self._skip_pending:
            return
        self._skip_pending = False
        optimizer.zero_grad(set_to_none=True)
        self.skipped += 1
        log.warning("Skipped the optimizer step at global step %d (batch %d): non-finite loss; "
                    "%d step(s) skipped so far.", trainer.global_step, self._batch_idx,
                    self.skipped)
        pl_module.log("train/nonfinite_skipped", float(self.skipped), on_step=True,
                      on_epoch=False, rank_zero_only=True)

    def state_dict(self) -> dict[str, int]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.skipped = int(state_dict.get("skipped", 0))
