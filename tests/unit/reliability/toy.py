"""A toy regression task for the reliability tests: dropout, an LR schedule, random targets.

``ToyDataset`` draws per-item noise (the stand-in for a random caption choice) either from the
global torch generator (``noise="global"``, exact to resume only with ``num_workers=0``) or
from ``sample_rng(seed, epoch, index)`` (``noise="sample"``, the epoch of the
``(item, caption, epoch)`` keys of ``BucketBatchSampler``), exact with workers too.

Shapes: b batch, c = dim features.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import Dataset

from mmtf.checkpoint_io import AtomicCheckpointIO
from mmtf.data import BucketBatchSampler, make_loader, sample_rng
from mmtf.reliability import ResumeState, capture_rng_state
from tests.forked import kill_orphans

DIM = 8


class ToyDataset(Dataset):
    def __init__(self, n: int = 24, seed: int = 0,
                 noise: Literal["global", "sample", "none"] = "global") -> None:
        g = torch.Generator().manual_seed(1000 + seed)
        self.x = torch.randn(n, DIM, generator=g)               # (n, c)
        self.y = self.x.sum(-1, keepdim=True)                   # (n, 1)
        self.seed, self.noise = seed, noise

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, key: int | tuple[int, int, int]) -> dict[str, Any]:
        index, _, epoch = key if isinstance(key, tuple) else (key, 0, 0)
        if self.noise == "global":
            eps = 0.1 * torch.randn(1)
        elif self.noise == "sample":
            eps = torch.tensor([0.1 * sample_rng(self.seed, epoch, index).standard_normal()],
                               dtype=torch.float32)
        else:
            eps = torch.zeros(1)
        return {"x": self.x[index], "y": self.y[index] + eps, "ids": f"s{index}"}


class ToyModule(L.LightningModule):
    """MLP with dropout, AdamW and a per-step LambdaLR; ``nan_at_steps`` poisons those steps."""

    def __init__(self, nan_at_steps: tuple[int, ...] = (), lr: float = 1e-2) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, 32), nn.Dropout(0.3), nn.ReLU(), nn.Linear(32, 1))
        self.nan_at_steps, self.lr = set(nan_at_steps), lr
        self.losses: list[float] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self.net(batch["x"]), batch["y"])
        if self.global_step in self.nan_at_steps:
            loss = loss * float("nan")
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("val/loss", nn.functional.mse_loss(self.net(batch["x"]), batch["y"]))

    def configure_optimizers(self) -> dict[str, Any]:
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class ToyData(L.LightningDataModule):
    def __init__(self, *, n: int = 24, batch_size: int = 4, num_workers: int = 0,
                 noise: Literal["global", "sample", "none"] = "global", seed: int = 0,
                 stateful: bool = True, val: bool = False, val_generator: bool = True) -> None:
        super().__init__()
        self.val_generator = val_generator
        self.n, self.batch_size, self.num_workers = n, batch_size, num_workers
        self.noise, self.seed, self.stateful, self.val = noise, seed, stateful, val

    def train_dataloader(self) -> Any:
        ds = ToyDataset(self.n, self.seed, self.noise)
        if not self.stateful:
            return torch.utils.data.DataLoader(ds, batch_size=self.batch_size, shuffle=True,
                                               num_workers=self.num_workers)
        sampler = BucketBatchSampler(lengths=[1.0] * len(ds), batch_size=self.batch_size,
                                     seed=self.seed, bucketing=False)
        return make_loader(ds, sampler, resumable=True, num_workers=self.num_workers,
                           seed=self.seed, split="train")

    def val_dataloader(self) -> Any:
        if not self.val:
            return []
        # Without its own generator, every iter() of a DataLoader draws its base seed (and a
        # RandomSampler its seed) from the global torch generator.
        gen = torch.Generator().manual_seed(self.seed + 1) if self.val_generator else None
        return torch.utils.data.DataLoader(ToyDataset(8, self.seed + 1, "none"), batch_size=4,
                                           shuffle=True, generator=gen)


class RecordEnd(Callback):
    """Keep the generators' state at the end of training on the module (``end_rng``)."""

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.end_rng = capture_rng_state()


class KillAt(Callback):
    """SIGKILL this process at the start of training batch ``step`` (no cleanup whatsoever)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def fit(root: Path, *, max_steps: int = -1, max_epochs: int | None = None,
        every_n_train_steps: int | None = None, every_n_epochs: int | None = None,
        monitor: str | None = None, val_check_interval: int | None = None,
        ckpt_path: str | None = None,
        kill_at: int | None = None, resume_state: bool | ResumeState = True, seed: int = 0,
        extra_callbacks: list[Callback] | None = None, val: bool = False,
        module: ToyModule | None = None, **data_kwargs: Any) -> tuple[L.Trainer, ToyModule]:
    """Train the toy from scratch (or ``ckpt_path``) with the reliability pieces in place."""
    L.seed_everything(seed, verbose=False)
    model = module or ToyModule()
    callbacks: list[Callback] = [*(extra_callbacks or []), RecordEnd()]
    if resume_state:
        callbacks.append(resume_state if isinstance(resume_state, ResumeState) else ResumeState())
    checkpointing = bool(every_n_train_steps or every_n_epochs or monitor)
    if checkpointing:
        callbacks.append(ModelCheckpoint(
            dirpath=root / "checkpoints", save_last=True, save_top_k=1 if monitor else -1,
            monitor=monitor, every_n_train_steps=every_n_train_steps,
            every_n_epochs=every_n_epochs, filename="{step}",
            save_on_train_epoch_end=every_n_epochs is not None and monitor is None))
    if kill_at is not None:
        callbacks.append(KillAt(kill_at))
    trainer = L.Trainer(
        default_root_dir=root, max_steps=max_steps, max_epochs=max_epochs, accelerator="cpu",
        devices=1,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=checkpointing,
        callbacks=callbacks, plugins=[AtomicCheckpointIO()], num_sanity_val_steps=0,
        limit_val_batches=2 if val else 0, val_check_interval=val_check_interval,
        deterministic=True)
    trainer.fit(model, datamodule=ToyData(val=val, **data_kwargs), ckpt_path=ckpt_path,
                weights_only=True)
    return trainer, model


def assert_same_training_state(ref: tuple[L.Trainer, ToyModule],
                               run: tuple[L.Trainer, ToyModule]) -> None:
    """Bit equality of weights, every optimizer state tensor, the LR schedule and the
    generators' end state (python, numpy, torch) of two fits."""
    (ref_trainer, ref_model), (trainer, model) = ref, run
    a, b = ref_model.state_dict(), model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"weight {k}: max diff {(a[k] - b[k]).abs().max()}"
    sa, sb = (t.optimizers[0].state_dict()["state"] for t in (ref_trainer, trainer))
    assert sa.keys() == sb.keys() and sa
    for i in sa:
        assert sa[i].keys() == sb[i].keys()
        for k in sa[i]:
            assert torch.equal(torch.as_tensor(sa[i][k]), torch.as_tensor(sb[i][k])), \
                f"optimizer state {i}.{k} differs"
    assert ref_trainer.lr_scheduler_configs[0].scheduler.state_dict() == \
        trainer.lr_scheduler_configs[0].scheduler.state_dict()
    ra, rb = ref_model.end_rng, model.end_rng
    assert torch.equal(ra["torch"], rb["torch"]), "torch generator state differs"
    assert torch.equal(ra["python"]["internal"], rb["python"]["internal"])
    assert torch.equal(ra["numpy"]["keys"], rb["numpy"]["keys"])
    assert ra["numpy"]["pos"] == rb["numpy"]["pos"]


def max_abs_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a.state_dict().values(),
                                                          b.state_dict().values()))


def _child(fn: Any, args: tuple, kwargs: dict) -> None:
    gc.freeze()                       # inherited garbage is not collected here: tests/forked.py
    os.setpgid(0, 0)                  # its loader workers join its group: killed with it below
    torch.set_num_threads(1)          # OpenMP pools do not survive fork; one thread is safe
    fn(*args, **kwargs)


def run_forked(fn: Any, *args: Any, timeout: float = 120, **kwargs: Any) -> int:
    """Run ``fn`` in a forked child (inherits the imports: no interpreter start-up); its exit
    code (-9 for SIGKILL; ``SystemExit(code)`` -> code).

    Waited for by its exit status, not ``Process.join``: join waits for the end of a pipe that
    the child's loader workers inherit, and a SIGKILLed child's workers only notice their
    parent is gone at their next status check (5 s). A child ended by a signal has its process
    group killed, so such orphans do not outlive the test; after a normal exit nothing is
    killed, so a process the code under test leaves behind stays visible to the test.
    """
    proc = mp.get_context("fork").Process(target=_child, args=(fn, args, kwargs))
    proc.start()
    with contextlib.suppress(OSError):        # also here: the child may not have run yet
        os.setpgid(proc.pid, proc.pid)
    deadline = time.monotonic() + timeout
    try:
        while proc.exitcode is None:           # exitcode polls waitpid(WNOHANG)
            if time.monotonic() > deadline:
                proc.kill()
                while proc.exitcode is None:
                    time.sleep(0.02)
                raise TimeoutError(f"forked {fn.__name__} did not finish in {timeout} s")
            time.sleep(0.02)
    finally:
        if proc.exitcode is not None and proc.exitcode < 0:
            kill_orphans(proc.pid)
    return proc.exitcode

