"""Preemption (SIGTERM): checkpoint at the end of the current batch, exit 143; fail fast on DDP.

What Lightning 2.6.6 does on SIGTERM (``trainer/connectors/signal_connector.py``): its handler
sets ``trainer.received_sigterm``, forwards SIGTERM to the DDP child processes it launched
(``launcher.kill``) and, under DDP, calls ``dist.broadcast`` *inside the signal handler*. The
loops then raise ``SIGTERMException`` at the next check: the end of the current training batch
(``_TrainingEpochLoop.on_advance_end``, after its validation), the end of the epoch
(``FitLoop.on_advance_end``), a validation batch boundary, or (DDP) the start of the next batch
after a broadcast + barrier. ``SIGTERMException`` is a ``SystemExit`` without a code, so the
process exits **0** and **saves nothing**: a scheduler sees success and the work since the last
``every_n_train_steps`` checkpoint is lost.

Under DDP that design also hangs: a Python signal handler runs wherever the main thread happens
to be, so the handler's broadcast on one rank meets a different collective (a gradient
all-reduce, a checkpoint barrier) on the other, and the local, unsynchronised checks make one
rank raise a batch before the other. Measured here with two gloo ranks: SIGTERM to rank 0 ->
both ranks blocked for good (rank 1 in the handler's broadcast, rank 0 in a collective).

:class:`PreemptionCheckpoint` therefore takes SIGTERM over once training starts
(``on_train_start``; Lightning restores the previous handler at teardown) with a handler that
only sets a flag. At every ``on_train_batch_end`` and ``on_train_epoch_end`` (reached by all
ranks in lockstep) the flags are max-reduced over ranks (one scalar per batch), so every rank
stops at the same batch even if only one was signalled: it then sets Lightning's own
``received_sigterm`` on every rank at once, and Lightning raises ``SIGTERMException`` after the
batch (or the epoch) as above, now in step. In ``on_exception`` (called on every rank before the strategy is torn down) it saves
``last.ckpt`` with ``trainer.save_checkpoint`` (through the Trainer's checkpoint IO, so atomic
with ``AtomicCheckpointIO``) and sets the exit code to 143 (128 + SIGTERM), what a shell reports
for a process killed by SIGTERM. A SIGTERM during validation is honoured at the end of that
validation's epoch or batch. SIGUSR1 / ``SLURMEnvironment(auto_requeue=True)`` (Lightning's
``hpc_ckpt_<n>.ckpt`` + ``scontrol requeue``) is left to Lightning; the SIGTERM that follows a
requeue then saves ``last.ckpt`` too.

:class:`DDPFailFast` covers the other way a multi-process job dies: one rank raises. A child
rank that dies is noticed by Lightning's ``_ChildProcessObserver`` (every 5 s it SIGKILLs the
main process and all children). But when rank 0, the launching process, raises, nothing kills
the children it spawned: over gloo they learn it when rank 0's sockets close; with NCCL they
wait in their next collective until the process-group timeout (30 min by default in
Lightning). ``DDPFailFast`` kills them from rank 0's ``on_exception``. It also logs every failing
rank's error with its rank at once, since a rank may be killed before its traceback would be
printed.

Shapes: none.
"""

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

log = logging.getLogger(__name__)

__all__ = ["DDPFailFast", "PreemptionCheckpoint", "PREEMPTED_EXIT_CODE"]

PREEMPTED_EXIT_CODE = 128 + int(signal.SIGTERM)   # 143


class PreemptionCheckpoint(Callback):
    """On SIGTERM: save ``last.ckpt`` at the next safe point and exit with ``exit_code``.

    Args:
        dirpath: where to write; None = the ModelCheckpoint's dirpath, else
            ``<default_root_dir>/checkpoints`` (where ``ckpt_path=last`` looks).
        filename: file name of the checkpoint.
        exit_code: process exit status after saving (143 = "terminated by SIGTERM").
    """

    def __init__(self, *, dirpath: str | None = None, filename: str = "last.ckpt",
                 exit_code: int = PREEMPTED_EXIT_CODE) -> None:
        if not filename.endswith(".ckpt"):
            raise ValueError(f"PreemptionCheckpoint: filename ({filename!r}) must end with "
                             f".ckpt; ckpt_path=last only looks at *.ckpt files.")
        if not 0 <= exit_code <= 255:
            raise ValueError(f"PreemptionCheckpoint: exit_code ({exit_code}) must be in 0..255.")
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
        connector = getattr(trainer, "_signal_connector", None)
        if connector is not None and hasattr(connector, "received_sigterm"):
            # Lightning's own flag, now set on every rank in the same batch: its loops raise
            # SIGTERMException after this batch's remaining hooks (ResumeState's capture,
            # ModelCheckpoint) and validation, or after the epoch at its last batch.
            connector.received_sigterm = True
        else:                                       # a Lightning without that attribute
            raise SIGTERMException()

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

    A no-op outside Lightning's subprocess launcher (torchrun, SLURM and the spawn launchers
    manage their own processes), for ``SIGTERMException`` (children got SIGTERM and save), and
    for ``KeyboardInterrupt`` (Lightning kills the children itself).

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
