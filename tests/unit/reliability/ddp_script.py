"""Two-rank CPU DDP (gloo) toy fit for the subprocess tests. Started once, Lightning re-launches
this file for rank 1 (``_SubprocessScriptLauncher``), as it does for ``python -m mmtf.train
trainer=ddp_cpu``; started once per rank with torchelastic's variables set (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ...), it is each rank of a torchrun job and launches nothing.

Usage: ``python ddp_script.py MODE RANK STEP OUT_DIR``

* ``raise``: rank RANK raises at the start of global step STEP.
* ``sigterm``: rank RANK's loss is NaN at step STEP (NonFiniteLossGuard skips that step on
  both ranks); training runs on until the test sends SIGTERM.
* ``exact``: 10 steps with dropout and random targets drawn on each rank; rank RANK sends
  itself SIGTERM at the start of step STEP (STEP < 0: never). ``exact-resume``: the same run
  from ``OUT_DIR/checkpoints/last.ckpt``. Each rank saves its end state (weights, optimizer
  state, generators) to ``OUT_DIR/end_rank<R>.pt``.

Ranks print ``rank R pid P`` at setup and ``rank R done step N`` after each batch. Every mode has ResumeState,
PreemptionCheckpoint, DDPFailFast, NonFiniteLossGuard(skip) and AtomicCheckpointIO attached, as
train.py will.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402

from mmtf.checkpoint_io import AtomicCheckpointIO  # noqa: E402
from mmtf.reliability import (  # noqa: E402
    DDPFailFast,
    NonFiniteLossGuard,
    PreemptionCheckpoint,
    ResumeState,
    capture_rng_state,
)
from tests.unit.reliability.toy import ToyData, ToyModule  # noqa: E402


class EndState(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, trainer, pl_module) -> None:
        torch.save({"weights": pl_module.state_dict(),
                    "optimizer": trainer.optimizers[0].state_dict()["state"],
                    "rng": capture_rng_state()}, self.out / f"end_rank{trainer.global_rank}.pt")


class Script(Callback):
    def __init__(self, mode: str, rank: int, step: int) -> None:
        self.mode, self.rank, self.step = mode, rank, step

    def setup(self, trainer, pl_module, stage) -> None:
        print(f"rank {trainer.global_rank} pid {os.getpid()}", flush=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (self.mode == "raise" and trainer.global_rank == self.rank
                and trainer.global_step == self.step):
            raise RuntimeError(f"boom on rank {trainer.global_rank} at step {trainer.global_step}")
        if (self.mode == "exact" and trainer.global_rank == self.rank
                and trainer.global_step == self.step):
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        print(f"rank {trainer.global_rank} done step {trainer.global_step}", flush=True)

    def on_train_end(self, trainer, pl_module) -> None:
        total = sum(float(p.double().sum()) for p in pl_module.parameters())
        print(f"rank {trainer.global_rank} finished step {trainer.global_step} "
              f"weights {total:.10f}", flush=True)


class NanOnRank(ToyModule):
    def __init__(self, rank: int, step: int) -> None:
        super().__init__()
        self.nan_rank, self.nan_step = rank, step

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.global_rank == self.nan_rank and self.global_step == self.nan_step:
            loss = loss * float("nan")
        return loss


def main() -> None:
    mode, rank, step, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    callbacks = [Script(mode, rank, step), ResumeState(), PreemptionCheckpoint(), DDPFailFast(),
                 NonFiniteLossGuard(policy="skip"),
                 ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=2,
                                 save_last=True, save_top_k=0)]
    exact = mode.startswith("exact")
    if exact:
        callbacks.append(EndState(out))
    model = NanOnRank(rank, step) if mode == "sigterm" else ToyModule()
    max_steps = {"sigterm": 400, "raise": 8}.get(mode, 10)
    resume = out / "checkpoints" / "last.ckpt" if mode == "exact-resume" else None
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=max_steps,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=out, callbacks=callbacks, plugins=[AtomicCheckpointIO()],
                        use_distributed_sampler=False, deterministic=exact)
    trainer.fit(model, datamodule=ToyData(noise="global" if exact else "none"),
                ckpt_path=resume, weights_only=True)


if __name__ == "__main__":
    main()
