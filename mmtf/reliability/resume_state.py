"""``ResumeState``: what Lightning does not checkpoint, for a bit-exact resume.

Saves the random generators' state (per rank) at every training batch end into every checkpoint
and applies it on resume; restores it after every validation run, so validation never shifts the
training stream; hands the train loader its saved position and calls
``batch_sampler.set_epoch``. Assumptions and the known inexact case:
docs/design/exact-resume.md."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from mmtf.reliability.rng import capture_rng_state, restore_rng_state
from mmtf.utils.compat import restore_train_loader_position
from mmtf.utils.distributed import gather_objects, world

log = logging.getLogger(__name__)

__all__ = ["ResumeState"]


def _loaders(obj: Any) -> list[Any]:
    """Flatten ``trainer.train_dataloader`` (a loader, or a list/dict of them)."""
    if obj is None:
        return []
    if isinstance(obj, dict):
        return [dl for v in obj.values() for dl in _loaders(v)]
    if isinstance(obj, (list, tuple)):
        return [dl for v in obj for dl in _loaders(v)]
    return [obj]


class ResumeState(Callback):
    """Save and restore RNG state (per rank) and keep the batch sampler's epoch in step.

    Args:
        restore_rng: write generator states into checkpoints and restore them on resume.
        isolate_validation: restore the training generators' state after each validation.
        set_sampler_epoch: call ``batch_sampler.set_epoch`` at each train epoch start.
    """

    def __init__(self, *, restore_rng: bool = True, isolate_validation: bool = True,
                 set_sampler_epoch: bool = True) -> None:
        self.restore_rng = restore_rng
        self.isolate_validation = isolate_validation
        self.set_sampler_epoch = set_sampler_epoch
        self._stream: dict[str, Any] | None = None    # state at the end of the last train batch
        self._pending: dict[str, Any] | None = None   # loaded from a checkpoint, not yet applied

    # ------------------------------------------------------------------ capture / apply
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        # Checkpoint callbacks run after all others, so this precedes any save at this batch.
        if self.restore_rng or self.isolate_validation:
            self._stream = capture_rng_state()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (self.isolate_validation and self._stream is not None and not trainer.sanity_checking
                and trainer.state.fn == "fit"):
            restore_rng_state(self._stream)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The sampler learns the loop's epoch before the first fetch: after a checkpoint
        # written at an epoch end, Lightning either finishes that epoch or starts the next.
        if restore_train_loader_position(trainer):
            log.info("ResumeState: restored the train loader's position from the checkpoint.")
        self._check_loaders(trainer)
        self._sync_sampler_epoch(trainer)
        if self._pending is not None:
            restore_rng_state(self._pending)
            self._stream, self._pending = self._pending, None
            log.info("ResumeState: restored RNG states of the checkpoint (global step %d).",
                     trainer.global_step)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync_sampler_epoch(trainer)

    def _check_loaders(self, trainer: L.Trainer) -> None:
        """Warn about loaders that make a resume inexact (once per fit)."""
        val = trainer.val_dataloaders if trainer.limit_val_batches else None
        for where, loaders in (("train", trainer.train_dataloader), ("val", val)):
            for dl in _loaders(loaders):
                if isinstance(dl, DataLoader) and dl.generator is None:
                    log.warning(
                        "ResumeState: a %s DataLoader has no generator; each iter() of it "
                        "draws from the global torch generator, so dropout after a resume can "
                        "differ from the uninterrupted run. Pass generator=torch.Generator()"
                        ".manual_seed(seed) (mmtf.data.make_loader does).", where)
        for dl in _loaders(trainer.train_dataloader):
            state = getattr(getattr(dl, "batch_sampler", None), "state", None)
            # A resumed fit whose sampler already walks another epoch, not from a checkpoint:
            # workers requested batches before any hook could set the epoch.
            if (trainer.global_step > 0 and state is not None and state.position > 0
                    and not state.restored and state.epoch != trainer.current_epoch):
                log.warning(
                    "ResumeState: Lightning resumed at the end of epoch %d without restoring "
                    "the train loader, and its workers already requested epoch %d's order; "
                    "epoch %d will not match the uninterrupted run. Checkpoint after "
                    "validation instead (ModelCheckpoint save_on_train_epoch_end=false).",
                    trainer.current_epoch - 1, state.epoch, trainer.current_epoch)

    def _sync_sampler_epoch(self, trainer: L.Trainer) -> None:
        if not self.set_sampler_epoch:
            return
        for dl in _loaders(trainer.train_dataloader):
            batch_sampler = getattr(dl, "batch_sampler", None)
            if callable(getattr(batch_sampler, "set_epoch", None)):
                batch_sampler.set_epoch(trainer.current_epoch)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """``{"rng": [state of rank 0, rank 1, ...]}``; plain data (weights_only-safe).

        Collective under DDP; safe because ``trainer.save_checkpoint`` runs on every rank.
        """
        if not self.restore_rng:
            return {}
        local = self._stream if self._stream is not None else capture_rng_state()
        return {"rng": gather_objects(local)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict.get("rng") if self.restore_rng else None
        if not states:
            return
        size, rank = world()
        if len(states) != size:
            log.warning("ResumeState: the checkpoint holds RNG states of %d ranks but this run "
                        "has %d; rank %d takes the state of saved rank %d (not an exact "
                        "resume).", len(states), size, rank, rank % len(states))
        self._pending = states[rank % len(states)]
