"""``ResumeState``: the training state Lightning does not checkpoint, for an exact resume.

Lightning restores weights, optimizer, LR schedulers, loop counters and (with a
``StatefulDataLoader``) the train loader's position. It does not restore random generators, so
after ``ckpt_path=...`` dropout masks, SpecAugment and main-process data randomness (random
caption choice with ``num_workers=0``) differ from the uninterrupted run. This callback:

* captures the generators' state at the end of every training batch (``on_train_batch_end``;
  Lightning runs checkpoint callbacks after all others, so this precedes any save there) and
  writes that captured state into every checkpoint, per rank;
* applies it in ``on_train_start`` of a resumed fit, i.e. after the loaders were re-created and
  before the first batch is fetched;
* puts the captured state back at the end of every validation run during fit, so validation
  (including the random base seed a DataLoader iterator draws) never shifts the training
  stream; a checkpoint written during or after validation therefore resumes identically, and
  changing the validation schedule does not change the training trajectory;
* hands the train loader its saved mid-epoch position when Lightning built the loader before
  restoring the loops (``estimated_stepping_batches`` in ``configure_optimizers``) and so
  never passed it on;
* calls ``set_epoch(epoch)`` on the train loader's batch sampler at each epoch start and at
  ``on_train_start`` (Lightning calls it only on ``dl.sampler`` and ``dl.batch_sampler.sampler``,
  and, after a resume, only after it has created the first iterator).

Exactness assumes: nothing else draws from the global generators between the end of a training
batch and the fetch of the next one (other callbacks' batch-end hooks); every DataLoader that
Lightning iterates during fit has its own ``generator`` (each ``iter()`` of one without it draws
from the global torch generator, and a resumed run re-creates the val iterator when it skips
the validation already done; ResumeState warns about such loaders); and dataset randomness in
worker processes comes from ``sample_rng(seed, epoch, index)``.

Known inexact case (warned about): epoch-based training (``max_steps=-1``) resumed from a
checkpoint written at an epoch end *without* validation in that epoch, with ``num_workers>0``:
Lightning 2.6 then does not restore the train loader, and the workers have already requested
the first batches in epoch 0's order before any hook can set the epoch.

Shapes: none.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from mmtf.reliability.rng import capture_rng_state, restore_rng_state

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


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class ResumeState(Callback):
    """Save and restore RNG state (per rank) and keep the batch sampler's epoch in step.

    Args:
        restore_rng: write generator states into checkpoints and restore them on resume.
        isolate_validation: restore the training stream's generator state after each
            validation run during fit.
        set_sampler_epoch: call ``batch_sampler.set_epoch(current_epoch)`` at each train epoch
            start when the batch sampler has that method.
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
        if self.restore_rng or self.isolate_validation:
            self._stream = capture_rng_state()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (self.isolate_validation and self._stream is not None and not trainer.sanity_checking
                and trainer.state.fn == "fit"):
            restore_rng_state(self._stream)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Tell a restored batch sampler which epoch the loop is in *before* the first fetch:
        # after a checkpoint written at an epoch end, Lightning either finishes that epoch
        # (the sampler must then yield nothing) or starts the next (a new order).
        self._load_pending_loader_state(trainer)
        self._check_loaders(trainer)
        self._sync_sampler_epoch(trainer)
        if self._pending is not None:
            restore_rng_state(self._pending)
            self._stream, self._pending = self._pending, None
            log.info("ResumeState: restored RNG states of the checkpoint (global step %d).",
                     trainer.global_step)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync_sampler_epoch(trainer)

    @staticmethod
    def _load_pending_loader_state(trainer: L.Trainer) -> None:
        """Give the train loader the position stored in the checkpoint if Lightning did not.

        ``trainer.estimated_stepping_batches`` (an LR schedule's length, read in
        ``configure_optimizers``) makes Lightning 2.6 build the train loader *before* the
        checkpoint's loop state is restored; ``FitLoop.setup_data`` then returns early and
        never passes the saved position to the loader, so a mid-epoch resume starts the epoch
        over. This does what ``setup_data`` would have done: load the state, re-create the
        iterator (``on_train_start`` comes before the first fetch).
        """
        fit_loop = trainer.fit_loop
        pending = getattr(fit_loop, "_combined_loader_states_to_load", None)
        if not pending or not fit_loop.restarting or fit_loop._combined_loader is None:
            return
        fetcher = getattr(fit_loop, "_data_fetcher", None)
        if fetcher is None:
            return
        fit_loop._load_combined_loader_states()
        iter(fetcher)            # the loader's new iterator starts from the loaded position
        log.info("ResumeState: restored the train loader's position from the checkpoint.")

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
                        ".manual_seed(seed) (make_stateful_dataloader does).", where)
        for dl in _loaders(trainer.train_dataloader):
            bs = getattr(dl, "batch_sampler", None)
            pass_epoch = getattr(bs, "pass_epoch", None)
            if (trainer.global_step > 0 and pass_epoch is not None
                    and not getattr(bs, "was_restored", True)
                    and pass_epoch != trainer.current_epoch):
                log.warning(
                    "ResumeState: Lightning resumed at the end of epoch %d without restoring "
                    "the train loader, and its workers already requested epoch %d's order; "
                    "epoch %d will not match the uninterrupted run. Checkpoint after "
                    "validation instead (ModelCheckpoint save_on_train_epoch_end=false).",
                    trainer.current_epoch - 1, pass_epoch, trainer.current_epoch)

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

        Under DDP this gathers from all ranks, which is safe because Lightning's
        ``trainer.save_checkpoint`` runs on every rank (it ends with a barrier).
        """
        if not self.restore_rng:
            return {}
        local = self._stream if self._stream is not None else capture_rng_state()
        world, _ = _world()
        if world == 1:
            return {"rng": [local]}
        states: list[Any] = [None] * world
        dist.all_gather_object(states, local)
        return {"rng": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict.get("rng") if self.restore_rng else None
        if not states:
            return
        world, rank = _world()
        if len(states) != world:
            log.warning("ResumeState: the checkpoint holds RNG states of %d ranks but this run "
                        "has %d; rank %d takes the state of saved rank %d (not an exact "
                        "resume).", len(states), world, rank, rank % len(states))
        self._pending = states[rank % len(states)]
