"""Preemption (SIGTERM): checkpoint at the end of the current batch, exit 143; fail fast on DDP.

:class:`PreemptionCheckpoint`'s handler only sets a flag; the flags are max-reduced over ranks at
each batch end so every rank stops at the same batch, and ``on_exception`` saves ``last.ckpt``
and sets exit status 143. :class:`DDPFailFast` kills the DDP children when rank 0 raises.
Why: docs/design/preemption.md."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from mmtf.errors import UserError
from mmtf.utils.compat import request_sigterm_stop

log = logging.getLogger(__name__)

__all__ = ["DDPFailFast", "PreemptionCheckpoint", "PREEMPTED_EXIT_CODE"]

PREEMPTED_EXIT_CODE = 128 + int(signal.SIGTERM)   # 143


class PreemptionCheckpoint(Callback):
    """On SIGTERM: save ``last.ckpt`` at the next safe point and exit with ``exit_code``.

    Args:
        dirpath: where to write; None = the ModelCheckpoint's dirpath, else
            ``<default_root_dir>/checkpoints`` (where ``ckpt_path=last`` looks).
        exit_code: process exit status after saving (143 = "terminated by SIGTERM").
    """

    def __init__(self, *, dirpath: str | None = None, filename: str = "last.ckpt",
                 exit_code: int = PREEMPTED_EXIT_CODE) -> None:
        if not filename.endswith(".ckpt"):
            raise UserError(f"PreemptionCheckpoint: filename ({filename!r}) must end with "
                            f".ckpt; ckpt_path=last only looks at *.ckpt files.")
        if not 0 <= exit_code <= 255:
            raise UserError(f"PreemptionCheckpoint: exit_code ({exit_code}) must be in 0..255.")
        self.dirpath, self.filename, self.exit_code = dirpath, filename, exit_code
        self.saved_path: str | None = None
        self._requested = False

    def checkpoint_path(self, trainer: L.Trainer) -> Path:
        """Where the preemption checkpoint goes for this trainer."""
        if self.dirpath is not None:
            return Path(self.dirpath) / self.filename
        ckpt_cb = trainer.checkpoint_callback
        dirpath = getattr(ckpt_cb, "dirpath", None)
        if dirpath is None:
            dirpath = Path(trainer.default_root_dir) / "checkpoints"
        return Path(dirpath) / self.filename

    # ------------------------------------------------------------------ signal -> flag
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._requested = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Only a flag: a handler runs between two bytecodes anywhere in the program, so no
        # I/O, no locks, no collectives here.
        self._requested = True

    @property
    def requested(self) -> bool:
        """True once SIGTERM arrived on this rank (during training)."""
        return self._requested

    def _stop_if_requested(self, trainer: L.Trainer) -> None:
        flag = self.requested
        if trainer.world_size > 1:                 # every rank is here, at the same batch
            t = torch.tensor([int(flag)], device=trainer.strategy.root_device)
            flag = bool(trainer.strategy.reduce(t, reduce_op="max").item())
        if not flag:
            return
        # Lightning's own flag, now set on every rank in the same batch: its loops raise
        # SIGTERMException after this batch's remaining hooks (ResumeState's capture,
        # ModelCheckpoint) and validation, or after the epoch at its last batch.
        request_sigterm_stop(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._stop_if_requested(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_requested(trainer)

    # ------------------------------------------------------------------ save + exit code
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        path = self.checkpoint_path(trainer)
        if trainer.state.fn == "fit" and trainer.global_step > 0:
            trainer.save_checkpoint(path, weights_only=False)   # every rank: a collective save
            self.saved_path = str(path)
            log.warning("SIGTERM: saved %s at global step %d; exiting with %d. Resume with "
                        "ckpt_path=last (or ckpt_path=%s).", path, trainer.global_step,
                        self.exit_code, path)
        else:
            log.warning("SIGTERM before the first optimizer step: nothing to save; exiting "
                        "with %d.", self.exit_code)
        exception.code = self.exit_code             # SystemExit(code) -> process status


class DDPFailFast(Callback):
    """When the launching rank fails, kill the DDP children Lightning started, at once.

    A no-op outside Lightning's subprocess launcher, for ``SIGTERMException`` (the children
    save) and for ``KeyboardInterrupt`` (Lightning kills them itself).

    Args:
        signum: signal sent to each child (SIGKILL: a process stuck in a collective ignores
            SIGTERM's Python handler until the collective returns).
    """

    def __init__(self, *, signum: int = int(signal.SIGKILL)) -> None:
        self.signum = signum

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        if isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            return
        if trainer.world_size > 1:
            # Say it now, with the rank: this process may be killed (by the launcher's
            # observer or by rank 0 here) before its error would reach the console.
            log.error("Rank %d of %d failed: %s: %s", trainer.global_rank, trainer.world_size,
                      type(exception).__name__, exception, exc_info=exception)
        procs: list[Any] = getattr(trainer.strategy.launcher, "procs", None) or []
        alive = [p for p in procs if p.poll() is None]
        if not alive:
            return
        log.error("Rank %d failed (%s); killing %d DDP child process(es) so the job ends now "
                  "instead of at the process-group timeout (a connection error here usually "
                  "means another rank failed first: see its error above).", trainer.global_rank,
                  type(exception).__name__, len(alive))
        for proc in alive:
            proc.send_signal(self.signum)
