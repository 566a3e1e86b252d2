"""Preemption (SIGTERM): checkpoint at the end of the current batch, exit 143; fail fast on DDP.

What Lightning 2.6.6 does on SIGTERM (``trainer/connectors/signal_connector.py``): its handler
sets ``trainer.received_sigterm``, forwards SIGTERM to the DDP child processes it launched
(``launcher.kill``) and, under DDP, broadcasts a flag from rank 0. The loops then raise
``SIGTERMException`` at the next safe point: the end of the current training batch
(``_TrainingEpochLoop.on_advance_end``, after its validation), the end of the epoch
(``FitLoop.on_advance_end``), a batch boundary in validation, or (DDP) before the next batch
on every rank after a barrier. ``SIGTERMException`` is a ``SystemExit`` without a code, so the
process exits **0** and **saves nothing**: a scheduler sees success and the last
``every_n_train_steps`` of work are lost.
With ``SLURMEnvironment(auto_requeue=True)`` Lightning additionally handles SIGUSR1 (save
``hpc_ckpt_<n>.ckpt``, ``scontrol requeue``); that path is untouched here.

:class:`PreemptionCheckpoint` handles that exception in ``on_exception`` (called on every rank
before the strategy is torn down): it saves ``last.ckpt`` with ``trainer.save_checkpoint`` (so
through the Trainer's checkpoint IO, atomic with ``AtomicCheckpointIO``) and sets the
exception's exit code to 143 (128 + SIGTERM), what a shell reports for a process killed by
SIGTERM. The checkpoint is taken after the batch completed, so its ``global_step`` is the step
reached and a resume continues with the next batch.

:class:`DDPFailFast` covers the other way a multi-process job dies: one rank raises. A child
rank that dies is noticed by Lightning's ``_ChildProcessObserver`` (every 5 s it SIGKILLs the
main process and all children). But when rank 0, the launching process, raises, nothing kills
the children it spawned: with NCCL they wait in their next collective until the process-group
timeout (30 min by default), and they outlive the job script. ``DDPFailFast`` kills them from
rank 0's ``on_exception``.

Shapes: none.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import lightning as L
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

    def checkpoint_path(self, trainer: L.Trainer) -> Path:
        """Where the preemption checkpoint goes for this trainer."""
        if self.dirpath is not None:
            return Path(self.dirpath) / self.filename
        ckpt_cb = trainer.checkpoint_callback
        dirpath = getattr(ckpt_cb, "dirpath", None)
        if dirpath is None:
            dirpath = Path(trainer.default_root_dir) / "checkpoints"
        return Path(dirpath) / self.filename

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
        procs: list[Any] = getattr(trainer.strategy.launcher, "procs", None) or []
        alive = [p for p in procs if p.poll() is None]
        if not alive:
            return
        log.error("Rank %d failed (%s); killing %d DDP child process(es) so the job ends now "
                  "instead of at the process-group timeout.", trainer.global_rank,
                  type(exception).__name__, len(alive))
        for proc in alive:
            proc.send_signal(self.signum)
